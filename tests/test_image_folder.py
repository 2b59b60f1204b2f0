"""A folder of your own images as a dataset (`--dataset=PATH`): real digits
written as PNG, JPEG, GIF, BMP and WebP files at test time (no committed
images), in several modes and sizes. Runs on TensorFlow and on JAX without
TensorFlow (CI's third stage): the reader is PIL and NumPy only."""

import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from keras_skipinit.data import digits, image_folder, sources as data_lib
from keras_skipinit.training import model_files, run_dir, trainer

CLASSES = {"one": 1, "seven": 7, "zero": 0}  # folder name -> digit; sorted names give labels 0, 1, 2


def write_folder(root, per_class=(40, 12), classes=None):
    """root/{train,test}/<class>/ (`classes`: folder name -> digit, default
    CLASSES): grayscale PNGs and JPEGs of real digits,
    and in each train class one RGB PNG, one RGBA PNG, one palette GIF, one
    BMP, one WebP and one 40x40 image (so sizes differ: the default size applies)."""
    (xtr, ytr), (xte, yte) = digits.split()
    for split, (x, y), count in (("train", (xtr, ytr), per_class[0]), ("test", (xte, yte), per_class[1])):
        for name, digit in (classes or CLASSES).items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i, image in enumerate(x[y == digit][:count]):
                gray = Image.fromarray(image[..., 0])
                if split == "train" and i < 6:
                    kind = ["rgb.png", "rgba.png", "p.gif", "bmp", "webp", "big.png"][i]
                    converted = {"rgb.png": gray.convert("RGB"), "rgba.png": gray.convert("RGBA"),
                                 "p.gif": gray.convert("P"), "bmp": gray, "webp": gray.convert("RGB"),
                                 "big.png": gray.resize((40, 40), Image.BILINEAR)}[kind]
                    converted.save(folder / f"{i}.{kind}")
                else:
                    gray.save(folder / f"{i}.{'jpg' if i % 4 == 0 else 'png'}", quality=95)
    return root


def test_a_folder_reads_as_sorted_classes_in_the_majority_mode(tmp_path):
    folder = image_folder.read(str(write_folder(tmp_path / "f")), default_size=32)
    assert folder.classes == ("one", "seven", "zero") and folder.eval_split == "test"
    (xtr, ytr), (xte, yte) = folder.train, folder.test
    assert xtr.shape == (120, 32, 32, 1) and xte.shape == (36, 32, 32, 1)  # sizes differ: the default; gray: 1
    assert xtr.dtype == np.uint8 and list(np.bincount(ytr)) == [40, 40, 40] and list(np.bincount(yte)) == [12] * 3
    # A digit is dark around a bright stroke: the centre is brighter than the border after resizing, in every file
    assert (xtr[:, 12:20, 12:20].mean(axis=(1, 2, 3)) > xtr[:, :3].mean(axis=(1, 2, 3))).mean() > 0.9


def test_images_in_a_class_subfolder_count_as_that_class_and_hidden_files_do_not(tmp_path):
    """torchvision's ImageFolder and Keras' image_dataset_from_directory read a class's subfolders; they
    were left out silently, and so were linked subfolders. Names starting with "." (.DS_Store,
    .ipynb_checkpoints/) stay out."""
    root = write_folder(tmp_path / "f", per_class=(8, 2))
    seven = root / "train" / "seven"
    (seven / "more" / "deeper").mkdir(parents=True)
    for i, image in enumerate(sorted(seven.glob("*.png"))[:3]):
        os.link(image, seven / "more" / ("deeper" if i else "") / f"copy{i}.png")
    (seven / ".ipynb_checkpoints").mkdir()
    (seven / ".ipynb_checkpoints" / "x.png").write_bytes(b"not an image")
    (seven / ".DS_Store").write_bytes(b"not an image")
    elsewhere = tmp_path / "elsewhere"  # a linked subfolder is followed (torchvision's os.walk(followlinks=True))
    elsewhere.mkdir()
    for i, image in enumerate(sorted(seven.glob("*.png"))[:2]):
        os.link(image, elsewhere / f"linked{i}.png")
    (seven / "linked").symlink_to(elsewhere, target_is_directory=True)
    (seven / "more" / "loop").symlink_to(seven, target_is_directory=True)  # a loop ends
    folder = image_folder.read(str(root), default_size=32)
    assert list(np.bincount(folder.train[1])) == [8, 8 + 3 + 2, 8] and folder.classes == ("one", "seven", "zero")


def test_a_held_out_tail_and_a_first_n_of_a_folder_hold_every_class(tmp_path):
    """A folder lists its training images class by class: --validation_examples (the last N) held out one
    class and --train_examples (the first N) trained on another, silently. Its training images now come in
    one fixed shuffled order: both hold every class, and two reads agree."""
    root = str(write_folder(tmp_path / "f", per_class=(40, 2)))
    dataset = data_lib.load(root, train_examples=30, validation_examples=30)
    (_, y_train), (_, y_held) = data_lib.pair(dataset.train), data_lib.pair(dataset.test)
    assert len(y_train) == 30 and len(y_held) == 30 and dataset.eval_split == "validation"
    assert set(y_train.tolist()) == set(y_held.tolist()) == {0, 1, 2}
    again = data_lib.load(root, train_examples=30, validation_examples=30)
    assert np.array_equal(data_lib.pair(again.test)[1], y_held)


def test_class_folders_alone_or_train_alone_hold_out_the_same_images_and_are_refused_without(tmp_path, monkeypatch):
    """Without an evaluated split, a folder of class folders (Keras' image_dataset_from_directory layout) or
    a train/ alone is the training images, and --validation_examples holds out the same images as from a
    whole train/test folder (in memory and streamed; there the test split is not decoded, nor checked: one
    of other classes is no error then); without it the run is refused before anything is written, saying
    how to go on."""
    whole = write_folder(tmp_path / "whole", per_class=(10, 2))
    shutil.copytree(whole / "train", tmp_path / "classes")
    shutil.copytree(whole / "train", tmp_path / "train_alone" / "train")
    shutil.copytree(whole, tmp_path / "other_test")  # a test split the run does not use, of other classes
    shutil.rmtree(tmp_path / "other_test" / "test" / "zero")
    want = data_lib.load(str(whole), validation_examples=6)
    assert image_folder.read(str(whole), held_out=True).test is None  # its test split goes unused: not decoded
    for fits in (True, False):
        monkeypatch.setattr(image_folder, "_fits_in_memory", lambda need: fits)
        for name in ("classes", "train_alone", "other_test"):
            got = data_lib.load(str(tmp_path / name), validation_examples=6)
            assert got.label_names == ("one", "seven", "zero") and got.eval_split == "validation"
            assert got.in_memory == fits
            for mine, theirs in ((got.train, want.train), (got.test, want.test)):
                images, labels = data_lib.pair(mine)
                if labels is None:  # streamed: read every record
                    images, labels = images.take(range(len(images)))
                np.testing.assert_array_equal(np.stack(images), theirs[0])
                np.testing.assert_array_equal(labels, theirs[1])
    for name, match in (("classes", "its folders are read as the classes of training images: pass "
                                    "--validation_examples=N"),
                        ("train_alone", "or pass --validation_examples=N")):
        config = trainer.Config(dataset=str(tmp_path / name), depth=10, model_dir=str(tmp_path / "run"))
        with pytest.raises(ValueError, match=re.escape(match)):
            trainer.validate(config)
        trainer.validate(dataclasses.replace(config, validation_examples=6))
    assert not (tmp_path / "run").exists()


def test_images_are_resized_and_centre_cropped_and_converted_as_documented(tmp_path):
    root = tmp_path / "f"
    for split in ("train", "test"):
        for name in ("a", "b"):  # a classifier needs two classes
            (root / split / name).mkdir(parents=True)
        # 20 wide, 40 high, left half (100, 150, 200), right half black: shorter side 20 -> 8, then 8x16 -> centre 8x8
        image = np.zeros((40, 20, 3), np.uint8)
        image[:, :10] = (100, 150, 200)
        Image.fromarray(image).save(root / split / "a" / "x.png")
        Image.fromarray(image).save(root / split / "b" / "y.png")
    gray = image_folder.read(str(root), image_size=8, channels=1).train[0]
    rgb = image_folder.read(str(root), image_size=8, channels=3).train[0]
    assert gray.shape == (2, 8, 8, 1) and rgb.shape == (2, 8, 8, 3)
    assert abs(int(gray[0, 4, 0, 0]) - (0.299 * 100 + 0.587 * 150 + 0.114 * 200)) <= 1  # ITU-R 601 luma
    assert list(rgb[0, 4, 0]) == [100, 150, 200] and list(rgb[0, 4, 7]) == [0, 0, 0]
    assert image_folder.read(str(root), channels=3).train[0].shape == (2, 40, 20, 3)  # one shared size: kept
    tiny = image_folder.decode(str(root / "train" / "a" / "x.png"), "RGB", 64)  # 20x40: scaled up, not refused
    assert tiny.shape == (64, 64, 3) and list(tiny[32, 0]) == [100, 150, 200] and list(tiny[32, 63]) == [0, 0, 0]


def test_16_bit_grayscale_is_scaled_to_8_bits_not_clipped(tmp_path):
    """A 16-bit PNG (medical, microscopy, depth images): x * 255 / 65535, as
    TensorFlow's decode_png gives; PIL's convert("L") clips it at 255 (white)."""
    wide = np.arange(0, 65536, 257, dtype=np.uint16)[:256].reshape(16, 16)  # 0, 257, ..., 65535
    wide[0, :4] = (128, 129, 65406, 65407)  # either side of x.5 after scaling: rounded
    Image.fromarray(wide).save(tmp_path / "x16.png")
    want = np.floor(wide.astype(np.float64) * 255 / 65535 + 0.5).astype(np.uint8)
    assert list(want[0, :4]) == [0, 1, 254, 255]
    for mode, channels in (("L", 1), ("RGB", 3)):
        ours = image_folder.decode(str(tmp_path / "x16.png"), mode, None)
        assert ours.shape == (16, 16, channels) and (ours == want[..., None]).all()


def test_a_large_jpeg_decodes_at_reduced_scale_to_the_same_picture(tmp_path, monkeypatch):
    """A photo many times the model's size is decoded by JPEG's own scaling
    (PIL's draft: 1/2, 1/4 or 1/8), never below the size it is resized to:
    the same picture as a full decode resized, at a fraction of the cost."""
    rows, cols = np.mgrid[0:480, 0:640]
    image = np.stack([rows * 255 // 480, cols * 255 // 640, (rows + cols) * 255 // 1120], -1).astype(np.uint8)
    Image.fromarray(image).save(tmp_path / "photo.jpg", quality=95)
    from PIL import JpegImagePlugin

    drafted, draft = [], JpegImagePlugin.JpegImageFile.draft
    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft",
                        lambda self, mode, size: (draft(self, mode, size), drafted.append(self.size))[0])
    ours = image_folder.decode(str(tmp_path / "photo.jpg"), "RGB", 60)
    assert drafted == [(80, 60)]  # decoded at 1/8 scale: still covers the 80x60 it is resized to
    with Image.open(tmp_path / "photo.jpg") as full:
        want = np.asarray(full.convert("RGB").resize((80, 60), Image.BILINEAR).crop((10, 0, 70, 60)))
    assert ours.shape == (60, 60, 3)
    assert np.abs(ours.astype(int) - want).mean() < 2  # gradients: a shifted or stretched picture is far off


def _truncated_png(path):
    buffer = path.parent / "whole.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), np.uint8)).save(buffer)  # incompressible
    whole = buffer.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    buffer.unlink()


@pytest.mark.parametrize("breakage,match", [
    ("missing", "no such folder"),
    ("a_file", "images.zip is a file, not a folder"),  # a relative name: not taken for a TFDS name
    ("no_train", "has no train/ folder"),
    ("no_test", "has no test/ (or validation/, val/) folder"),
    ("empty_class", "holds no images"),
    ("other_classes", "have different classes; missing from test/: zero"),
    ("not_an_image", "notes.txt: not an image file"),
    ("truncated", "broken.png: truncated or corrupt"),
    ("float_pixels", "depth.tiff: 32-bit float pixels (mode F) have no fixed range"),
    # Issue 89.2: one class "trained to 100%"; 91.18: a FIFO hung train.py; 91.20: a line break made a
    # labels file of more lines than classes.
    ("one_class", "holds one class folder (images): a classifier needs two classes or more"),
    ("fifo", "pipe.png: a FIFO, not an image file"),
    ("dangling_link", "gone.png: a link to nothing"),
    ("line_break", "a class name with a line break"),
])
def test_bad_folders_are_one_line_naming_what_is_wrong(tmp_path, monkeypatch, breakage, match):
    root = write_folder(tmp_path / "f", per_class=(8, 2))
    if breakage == "missing":
        root = tmp_path / "nowhere"
    elif breakage == "a_file":
        monkeypatch.chdir(tmp_path)
        (tmp_path / "images.zip").write_bytes(b"PK")
        root = "images.zip"
    elif breakage in ("no_train", "no_test"):
        os.rename(root / breakage[3:], tmp_path / "elsewhere")
    elif breakage == "empty_class":
        for f in (root / "train" / "one").iterdir():
            f.unlink()
    elif breakage == "other_classes":
        for f in (root / "test" / "zero").iterdir():
            f.unlink()
        (root / "test" / "zero").rmdir()
    elif breakage == "not_an_image":
        (root / "train" / "one" / "notes.txt").write_text("a list of digits")
    elif breakage == "one_class":  # my_images/{train,test}/images/*.png
        for split in ("train", "test"):
            for name in ("seven", "zero"):
                shutil.rmtree(root / split / name)
            os.rename(root / split / "one", root / split / "images")
    elif breakage == "fifo":
        os.mkfifo(root / "train" / "one" / "pipe.png")
    elif breakage == "dangling_link":
        os.symlink(tmp_path / "nothing.png", root / "train" / "one" / "gone.png")
    elif breakage == "line_break":
        for split in ("train", "test"):
            os.rename(root / split / "one", root / split / "o\nne")
    elif breakage == "float_pixels":
        Image.fromarray(np.ones((28, 28), np.float32)).save(root / "train" / "one" / "depth.tiff")
    else:
        _truncated_png(root / "train" / "seven" / "broken.png")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=re.escape(match)) as error:
        data_lib.load(str(root))
    assert "\n" not in str(error.value)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written into the folder
    if breakage in ("not_an_image", "truncated", "float_pixels"):  # skipped on request, and counted
        folder = image_folder.read(str(root), skip_bad=True)
        assert len(folder.skipped) == 1 and len(folder.train[0]) == 24


def test_a_streamed_file_found_truncated_when_a_batch_reads_it_is_one_line(tmp_path):
    """A streamed folder's files are checked by their headers; one whose data is cut is named when a batch
    reads it: on TensorFlow that came wrapped in tf.data's error, 68 lines (issue 91.15); on every backend
    now the one line, with the run's training never finished."""
    root = write_folder(tmp_path / "f", per_class=(8, 2))
    _truncated_png(root / "train" / "seven" / "broken.png")
    config = trainer.Config(dataset=str(root), depth=10, epochs=1, batch_size=8, stream_images=True,
                             model_dir=str(tmp_path / "run"), verbose=0)
    with pytest.raises(ValueError) as error:
        trainer.train(config)
    assert str(error.value) == (f"{root / 'train' / 'seven' / 'broken.png'}: truncated or corrupt: PIL cannot decode "
                                "it (read as a batch needed it: the folder is streamed, its files checked by their "
                                "headers only)")
    assert not (tmp_path / "run" / run_dir.RESULTS).exists()


def test_skipping_bad_images_that_empties_a_class_is_refused(tmp_path, monkeypatch):
    """--skip_bad_images on a class folder of text files named .jpg trained with a label of no images
    (issue 91.7): refused as an empty class folder is, in memory and streamed."""
    root = write_folder(tmp_path / "f", per_class=(4, 2))
    for split in ("train", "test"):
        (root / split / "bad").mkdir()
        for i in range(3):
            (root / split / "bad" / f"{i}.jpg").write_text("not a picture")
    for fits in (True, False):
        monkeypatch.setattr(image_folder, "_fits_in_memory", lambda need: fits)
        with pytest.raises(ValueError, match=re.escape(f"{root / 'train' / 'bad'}: every image was skipped")):
            data_lib.load(str(root), folder=dict(skip_bad=True))


@pytest.mark.heavy
def test_a_folder_trains_and_its_class_names_go_with_the_run(tmp_path, capsys):
    """Three epochs of WRN-10-1 with BatchNorm (momentum 0.9, lr 0.1) on 300
    training images of three digits, in every format and mode above. Seeds
    0-3 (training images in the folder's fixed shuffled order): test top-1
    0.94, 0.99, 0.86, 0.93 on TensorFlow, 0.70, 0.90, 0.96, 0.94 on JAX
    (chance: 1/3); the bound is far above chance, under the lowest seed."""
    root = write_folder(tmp_path / "f", per_class=(100, 30))
    config = trainer.Config(dataset=str(root), depth=10, normalization="batchnorm", bn_momentum=0.9, epochs=3,
                             batch_size=16, learning_rate=0.1, model_dir=str(tmp_path / "run"), verbose=0)
    results = trainer.train(config)
    assert results["status"] == "completed" and results["num_test"] == 90
    # The run says what it read (issue 89.6: nothing before)
    assert (f"{root}: 300 training and 90 test images, 3 classes (one, seven, zero), read at 32x32, 1 channel, in "
            "memory; preprocessing standardize") in capsys.readouterr().out
    assert results["test_top1"] > 0.6, results
    spec = json.load(open(tmp_path / "run" / "model_spec.json"))
    assert spec["labels"] == ["one", "seven", "zero"]
    assert spec["model"]["input_shape"] == [32, 32, 1]
    # The run's model.keras carries them too: predict names the classes from the file alone.
    from keras_skipinit.predict import cli as predict

    alone = tmp_path / "alone.keras"
    shutil.copy(tmp_path / "run" / run_dir.MODEL, alone)
    assert predict.load(str(alone)).labels == {0: "one", 1: "seven", 2: "zero"}


def test_a_folder_is_told_once_per_load_and_its_path_comes_with_its_data(tmp_path, monkeypatch):
    """`load` asks once which source a name is (a folder was told twice: for its own statistics and by
    `SOURCES`), and a folder's absolute path comes with its Dataset (model_spec.json records it for export,
    issue 91.21) rather than being told again from the name."""
    root = write_folder(tmp_path / "f", per_class=(8, 2))
    asked = []
    looks = image_folder.looks_like_folder
    monkeypatch.setattr(image_folder, "looks_like_folder", lambda name: asked.append(name) or looks(name))
    monkeypatch.chdir(tmp_path)
    dataset = data_lib.load("f", preprocessing_choice="mean_std")
    assert asked == ["f"] and dataset.folder == str(root)
    assert data_lib.load(data_lib.EMBEDDED).folder is None
    (xtr, ytr), _ = digits.split()  # a folder of 28x28 gray digits read as 32x32x3 (`_rgb32`): its name says so too
    for split in ("train", "test"):
        for digit in (1, 7):
            (tmp_path / "g" / split / str(digit)).mkdir(parents=True)
            for i, image in enumerate(xtr[ytr == digit][:4]):
                Image.fromarray(image[..., 0]).save(tmp_path / "g" / split / str(digit) / f"{i}.png")
    rgb = data_lib.load("g_rgb32")
    assert rgb.folder == str(tmp_path / "g") + data_lib.RGB32 and rgb.raw_shape == (32, 32, 3)
    again = data_lib.load(rgb.folder)  # what export reads from model_spec.json's dataset_folder, from anywhere
    assert (again.raw_shape, again.num_train) == (rgb.raw_shape, rgb.num_train)


def test_mean_std_on_a_folder_uses_its_own_training_images_statistics(tmp_path):
    """--preprocessing=mean_std on a folder: per-channel mean and std of the
    images it trains on (not the held-out ones), computed by hand here; the
    run records them in its preprocessing name, which exports rebuild."""
    from keras_skipinit.data import preprocessing
    from keras_skipinit.training import run_dir
    root = write_folder(tmp_path / "f", per_class=(20, 4))
    dataset = data_lib.load(str(root), preprocessing_choice="mean_std", validation_examples=12)
    images = dataset.train[0].astype(np.float64)
    assert dataset.preprocessing == preprocessing.stats_name((images.mean(),), (images.std(),))
    x = dataset.test[0][:4]
    np.testing.assert_allclose(preprocessing.get(dataset.preprocessing).numpy(x),
                               (x - images.mean()) / images.std(), rtol=1e-4, atol=1e-4)
    config = trainer.Config(dataset=str(root), preprocessing="mean_std", depth=10, epochs=1, steps_per_epoch=2,
                             batch_size=8, model_dir=str(tmp_path / "run"), verbose=0)
    trainer.train(config)
    recorded = run_dir.read_spec(str(tmp_path / "run"))["preprocessing"]
    assert recorded.startswith("mean_std(") and preprocessing.get(recorded).name == recorded
    assert (model_files.keras_metadata(str(tmp_path / "run" / run_dir.MODEL)) or {}).get("preprocessing") == recorded


@pytest.mark.heavy
def test_a_continued_run_keeps_the_mean_std_statistics_it_started_with(tmp_path, capsys):
    """An image replaced between epochs gave a continuation other statistics than its first epoch's, and
    only the new ones were recorded (issue 91.8): the continuation uses the recorded ones, and says so."""
    from keras_skipinit.training import run_dir
    root = write_folder(tmp_path / "f", per_class=(8, 2))
    config = trainer.Config(dataset=str(root), preprocessing="mean_std", depth=10, epochs=1, batch_size=8,
                             model_dir=str(tmp_path / "run"), verbose=0)
    trainer.train(config)
    first = run_dir.read_spec(str(tmp_path / "run"))["preprocessing"]
    replaced = next(p for p in sorted((root / "train" / "one").iterdir()) if p.suffix == ".png")
    Image.fromarray(np.full((28, 28), 255, np.uint8)).save(replaced)  # same count, brighter statistics
    assert data_lib.load(str(root), preprocessing_choice="mean_std").preprocessing != first
    capsys.readouterr()
    results = trainer.train(dataclasses.replace(config, epochs=2))
    assert results["status"] == "completed" and results["epochs_completed"] == 2
    assert run_dir.read_spec(str(tmp_path / "run"))["preprocessing"] == first
    assert f"continues with the preprocessing it started with, {first}" in capsys.readouterr().out


def test_mean_std_of_a_constant_channel_names_it(tmp_path):
    """A folder whose images are one flat grey: per-channel statistics cannot scale it, and the refusal said
    "preprocessing must be one of ..." (issue 91.22): it names the channel."""
    for split, count in (("train", 3), ("test", 1)):
        for name in ("a", "b"):
            (tmp_path / "f" / split / name).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(np.full((8, 8), 90, np.uint8)).save(tmp_path / "f" / split / name / f"{i}.png")
    with pytest.raises(ValueError, match=re.escape("--preprocessing=mean_std: channel 0 of ") + ".*" +
                       re.escape("training images is constant (mean 90, std 0): per-channel statistics cannot "
                                 "scale it; use --preprocessing=standardize")):
        data_lib.load(str(tmp_path / "f"), preprocessing_choice="mean_std")


def test_mean_std_on_a_folder_of_large_images_is_refused_before_its_statistics_are_read(tmp_path, monkeypatch):
    """The size rule (mean_std up to 64 px) refuses first: a streamed folder's
    statistics would read every image."""
    from keras_skipinit.data import preprocessing
    root = write_folder(tmp_path / "f", per_class=(4, 2))
    monkeypatch.setattr(preprocessing, "channel_stats", lambda chunks: pytest.fail("statistics read"))
    with pytest.raises(ValueError, match="is for images up to 64 px"):
        data_lib.load(str(root), preprocessing_choice="mean_std", folder=dict(image_size=72))


def test_a_folder_too_large_for_memory_is_streamed_with_the_same_examples(tmp_path, monkeypatch):
    """Where its decoded images would take more than half the memory
    available, a folder is read per batch (numpy_data.Records over
    image_folder.Files): the same evaluation batches and the same first
    training batch as in memory, on this backend's feed, the same mean_std
    statistics, and a run trains on it."""
    import keras

    from keras_skipinit.data import pipelines
    def batches(feed, count=None):
        if isinstance(feed, keras.utils.PyDataset):
            return [feed[i] for i in range(count or len(feed))]
        return list(feed.take(count) if count else feed)

    root = write_folder(tmp_path / "f", per_class=(20, 4))
    whole = data_lib.load(str(root))
    whole_mean_std = data_lib.load(str(root), preprocessing_choice="mean_std").preprocessing
    monkeypatch.setattr(image_folder, "_fits_in_memory", lambda need: False)
    streamed = data_lib.load(str(root))
    assert not streamed.in_memory and (streamed.num_train, streamed.num_test) == (whole.num_train, whole.num_test)
    for mine, theirs in ((batches(pipelines.eval_pipeline(streamed, 16)), batches(pipelines.eval_pipeline(whole, 16))),
                         (batches(pipelines.train_pipeline(streamed, 16, 0), 1),
                          batches(pipelines.train_pipeline(whole, 16, 0), 1))):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
            np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))
    assert data_lib.load(str(root), preprocessing_choice="mean_std").preprocessing == whole_mean_std
    results = trainer.train(trainer.Config(dataset=str(root), depth=10, epochs=1, steps_per_epoch=3, batch_size=8,
                                             model_dir=str(tmp_path / "run"), verbose=0))
    assert results["status"] == "completed" and results["num_test"] == 12


@pytest.mark.heavy
def test_every_epoch_trains_every_image_once_in_order_streamed_or_not_resumed_or_not(tmp_path, monkeypatch):
    """Issue 91.1: on JAX a streamed folder's epoch trained batches 1..k twice and its last ones never (Keras'
    enqueuer kept what it had read ahead of fit's peek at batch 0 and served it first at the next start). The
    same run in memory, streamed (--stream_images), and streamed, killed after a mid-epoch checkpoint and
    resumed, ends with the same weights: each epoch trained the same batches in the same order."""
    import keras

    from keras_skipinit.training.checkpoint import Checkpoint

    root = write_folder(tmp_path / "f", per_class=(16, 2))  # 48 training images: 6 batches of 8 an epoch
    base = dict(dataset=str(root), depth=10, epochs=2, batch_size=8, learning_rate=0.05, checkpoint_steps=2,
                verbose=0)

    def weights(name, **kwargs):
        assert trainer.train(trainer.Config(model_dir=str(tmp_path / name), **base, **kwargs))["status"] == "completed"
        model = keras.models.load_model(os.path.join(tmp_path / name, run_dir.MODEL))
        return [keras.ops.convert_to_numpy(w) for w in model.weights]

    class Killed(Exception):
        pass

    save = Checkpoint.save

    def kill_after_a_mid_epoch_checkpoint(self, model, epoch, step, **state):
        save(self, model, epoch, step, **state)
        if (epoch, step) == (0, 2):
            raise Killed

    in_memory = weights("in_memory")
    assert not data_lib.load(str(root), folder=dict(stream=True)).in_memory
    monkeypatch.setattr(Checkpoint, "save", kill_after_a_mid_epoch_checkpoint)
    with pytest.raises(Killed):
        weights("resumed", stream_images=True)
    monkeypatch.undo()
    for name in ("streamed", "resumed"):
        got = weights(name, stream_images=True)
        assert len(got) == len(in_memory)
        for a, b in zip(got, in_memory):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_run_resumed_on_a_folder_that_changed_is_refused(tmp_path):
    """A folder's images resumed (raised --epochs, or after a kill) after images or classes were added: the
    run continued on other images, silently. Refused, one line naming what changed; the run is left as it was."""
    root = write_folder(tmp_path / "f", per_class=(4, 2))
    config = trainer.Config(dataset=str(root), depth=10, epochs=1, steps_per_epoch=1, batch_size=8,
                             model_dir=str(tmp_path / "run"), verbose=0)
    assert trainer.train(config)["status"] == "completed"
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file() and p.name != ".lock"}
    shutil.copy(root / "train" / "one" / "0.rgb.png", root / "train" / "one" / "copy.png")
    longer = dataclasses.replace(config, epochs=2)
    with pytest.raises(ValueError, match=re.escape("(12 training examples then, 13 now): resuming would train on "
                                                   "other images")):
        trainer.train(longer)
    (root / "train" / "one" / "copy.png").unlink()
    for split in ("train", "test"):
        os.rename(root / split / "seven", root / split / "nine")
    with pytest.raises(ValueError, match=re.escape("classes one, seven, zero then, nine, one, zero now")):
        trainer.train(longer)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file() and p.name != ".lock"} == before
