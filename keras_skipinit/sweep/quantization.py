"""The int8 study, step 2: every completed final run of a sweep's --out
exported float32, float16 and int8 (LiteRT) and float32 and int8 (ONNX
Runtime) by `deploy`, each file's top-1 accuracy measured in its runtime on
the run's evaluation split beside the Keras model's.

    python -m keras_skipinit.sweep.quantization --out=docs/int8_quantization

One line of ``quantization.jsonl`` per (run, file), appended as each file is
checked, so a killed study resumes at the next file; ``quantization.md`` is
the table (mean and std over seeds). The files go to each run's
``<model_dir>/exports/``.
"""

import json
import os
import statistics
import sys
import time

LOG = "quantization.jsonl"
TABLE = "quantization.md"
# (format, quantize): the five files of every run, float first (the reference for the others' size).
VARIANTS = (("litert", None), ("litert", "float16"), ("litert", "int8"), ("onnx", None), ("onnx", "int8"))


def variant_name(fmt, quantize):
    return f"{fmt} {quantize or 'float32'}"


def final_runs(out):
    """The completed final runs recorded in `out`'s runs.jsonl, in method then seed order."""
    from keras_skipinit.sweep import log, protocol

    runs = log.load(os.path.join(out, log.LOG))
    finals = [r for r in runs.values() if r.get("phase") == protocol.FINAL and r["status"] == "completed"]
    return sorted(finals, key=lambda r: (r["method"], r["depth"], r["seed"]))


def read_log(path, repair=False):
    """quantization.jsonl's records (an incomplete last line, from a kill,
    dropped: its file is made again; with `repair`, cut from the file)."""
    from keras_skipinit.sweep import log

    fields = {"run": str, "method": str, "seed": int, "variant": str, "status": str, "bytes": int,
              "keras_top1": log.NUMBER, "file_top1": log.NUMBER}
    return log.read_jsonl(path, fields, "a quantization record", repair)


def _run_key(run):
    return f"{run['method']}_d{run['depth']}_s{run['seed']}"


def quantize_runs(out, check_images=10000, calibration_images=200):
    """Exports and checks every file not yet in `out`/quantization.jsonl."""
    from keras_skipinit import machine, spec
    from keras_skipinit.data import pipelines, sources as data_lib
    from keras_skipinit.serving import deploy, savedmodel
    from keras_skipinit.training import run_dir
    from keras_skipinit.sweep import log

    path = os.path.join(out, LOG)
    done = {(r["run"], r["variant"]) for r in read_log(path, repair=True)}
    finals = final_runs(out)
    if not finals:
        raise ValueError(f"{out} has no completed final runs (runs.jsonl): run the sweep's preset first")
    datasets = {}
    for run in finals:
        todo = [(fmt, q) for fmt, q in VARIANTS if (_run_key(run), variant_name(fmt, q)) not in done]
        if not todo:
            continue
        model_dir = os.path.join(out, run["results"]["config"]["model_dir"])  # relative to --out (runner.record)
        model, preprocessing, _ = savedmodel.load_source(model_dir)
        config = run_dir.read_spec(model_dir)["config"]
        wanted = {**config, "train_examples": None, "validation_examples": None, "preprocessing": None}
        # Runs of one dataset (and image size, and model: its default size) share their images.
        name = json.dumps([spec.section(wanted, "data"), spec.section(wanted, "model")], sort_keys=True)
        if name not in datasets:
            dataset = data_lib.load_for(wanted)
            images, labels = pipelines.sample_images(dataset, "eval", check_images, dataset.preprocessing)
            calibration, _ = pipelines.sample_images(dataset, "train", calibration_images, dataset.preprocessing)
            datasets[name] = (dataset.eval_split, images, labels, calibration)
        split, images, labels, calibration = datasets[name]
        want = deploy.keras_probabilities(model, images, preprocessing)  # once for the run's five files
        os.makedirs(os.path.join(model_dir, "exports"), exist_ok=True)
        for fmt, quantize in todo:
            start = time.time()
            file = os.path.join(model_dir, "exports", f"model_{quantize or 'float32'}{deploy.FORMATS[fmt].suffix}")
            try:
                deploy.export_file(model, fmt, file, preprocessing, quantize=quantize, overwrite=True,
                                   calibration=calibration if quantize == "int8" else None,
                                   check_on=(images, labels, want))
                report, status = deploy.read_check(file), "checked"
            except deploy.CheckFailed as e:  # a float file beyond the tolerance: recorded, not hidden
                report, status = e.report, "check_failed"
            line = {"run": _run_key(run), "method": run["method"], "depth": run["depth"], "seed": run["seed"],
                    "lr": run["lr"], "variant": variant_name(fmt, quantize), "format": fmt,
                    "quantize": quantize or "float32", "status": status, "split": split,
                    **{k: report[k] for k in ("bytes", "images", "max_abs_diff", "top1_agreement",
                                              "keras_top1", "file_top1")},
                    "wall_time_s": round(time.time() - start, 1), "machine": machine.describe()}
            log.append(path, line)
            print(f"{line['run']} {line['variant']}: top-1 {100 * line['file_top1']:.2f}% "
                  f"(Keras float {100 * line['keras_top1']:.2f}%), {line['bytes']:,} bytes, "
                  f"{line['wall_time_s']:.0f} s", flush=True)
    return read_log(path)


def _mean_std(values, scale=100.0, digits=2):
    values = [scale * v for v in values]
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    # The population std (ddof 0), as every table of the sweep (np.std): for two seeds, half their difference.
    return f"{statistics.mean(values):.{digits}f} ± {statistics.pstdev(values):.{digits}f}"


def table(records):
    """Markdown: per method, the Keras float accuracy, then each file's
    accuracy, its change against the Keras model of the same run, and its size."""
    from keras_skipinit.sweep.presets import METHOD_SETTINGS

    methods = list(dict.fromkeys(r["method"] for r in records))
    variants = [variant_name(f, q) for f, q in VARIANTS]
    lines = ["Top-1 test accuracy % of each exported file (mean ± std over seeds; in brackets the change "
             "against the Keras float model of the same run, in points), file size in KB", "",
             "| method | seeds | Keras float32 | " + " | ".join(variants) + " |",
             "|---|---|---|" + "---|" * len(variants)]
    for method in methods:
        rows = [r for r in records if r["method"] == method]
        seeds = sorted({r["seed"] for r in rows})
        keras_top1 = [next(r["keras_top1"] for r in rows if r["seed"] == s) for s in seeds]
        cells = []
        for variant in variants:
            got = [r for r in rows if r["variant"] == variant]
            if not got:
                cells.append("—")
                continue
            change = _mean_std([r["file_top1"] - r["keras_top1"] for r in got])
            cells.append(f"{_mean_std([r['file_top1'] for r in got])} ({change}); {got[0]['bytes'] / 1024:.0f} KB"
                         + ("" if len(got) == len(seeds) else f"; {len(got)} of {len(seeds)} seeds"))
        lines.append(f"| {METHOD_SETTINGS[method][0]} | {len(seeds)} | {_mean_std(keras_top1)} | " + " | ".join(cells) + " |")
    failed = [r for r in records if r["status"] != "checked"]
    if failed:
        lines += ["", "Float files beyond the tolerance: " + ", ".join(f"{r['run']} {r['variant']}" for r in failed)]
    return "\n".join(lines) + "\n"


def main(argv=None):
    from keras_skipinit.sweep import cli

    parser = cli.quantization_parser()
    args = parser.parse_args(argv)
    try:
        if args.report_only and not os.path.isfile(os.path.join(args.out, LOG)):
            raise ValueError(f"no {LOG} in {args.out}: run the study without --report_only first")
        records = read_log(os.path.join(args.out, LOG)) if args.report_only else quantize_runs(
            args.out, args.check_images, args.calibration_images)
    except ValueError as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(args.out, TABLE), "w") as f:
        f.write(table(records))
    print(f"Wrote {os.path.join(args.out, TABLE)}")
    return 0


if __name__ == "__main__":
    from keras_skipinit.cli import parsing
    parsing.start("python -m keras_skipinit.sweep.quantization", "keras_skipinit.sweep.cli:parse_quantization")
    sys.exit(main())
