"""Preparing TFDS datasets on machines with no or limited network (preparing needs TensorFlow).

`builder(name, data_dir)` finds a TFDS builder, with close names suggested for
a typo. `prepare(builder, manual_dir)` runs TFDS's own `download_and_prepare`,
so the result is a normal prepared dataset in ``data_dir``, and

- reads the original download files from ``manual_dir`` when they are there
  (TFDS's manual-download mechanism), with their checksums verified. Known
  copies whose bytes differ from TFDS's registered checksums only in
  packaging are accepted by their own checksums (`LOCAL_COPIES`): Debian's
  ``dataset-fashion-mnist`` installs the four Fashion-MNIST files under
  /usr/share/datasets/fashion-mnist, re-gzipped without the file name in
  the gzip header, so TFDS alone rejects them;
- without local files, checks in a few seconds that the download host is
  reachable (offline, TFDS retries for minutes before a traceback);
- turns every way preparation fails into one `ValueError` line that says
  what to do: a ``--data_dir`` holding the prepared dataset, or where to put
  the files;
- lets one process at a time prepare a dataset in a data_dir (a lock file
  there): runs that start together (two sweeps, Ray's trials) wait for the
  first instead of racing it to TFDS's final rename, which the loser fails.
"""

import contextlib
import dataclasses
import difflib
import fcntl  # POSIX, as run_dir's model_dir lock
import hashlib
import logging
import os
import re
import socket
import urllib.parse

from keras_skipinit.data import image_folder


@dataclasses.dataclass(frozen=True)
class LocalCopy:
    """A known local copy of a dataset's download files."""

    directory: str  # where it installs them (the default manual_dir)
    how_to_get: str
    sha256: dict  # file name -> sha256 of this copy's file


LOCAL_COPIES = {
    "fashion_mnist": LocalCopy(
        directory="/usr/share/datasets/fashion-mnist",
        how_to_get="apt-get install dataset-fashion-mnist",
        # Debian's dataset-fashion-mnist 0.0~git20200523.55506a9-1.
        sha256={
            "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
            "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
            "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
            "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
        },
    ),
}
CONNECT_TIMEOUT_S = 5.0


# TFDS's notes that read as trouble where there is none: an unprepared dataset's version folder "has no
# dataset_info.json" (asked before preparing it), and the advice to install OpenCV on each read (PIL decodes).
_NOTES = ("has no dataset_info.json", "OpenCV is not installed")


def _not_a_note(record):
    """A logging filter (on absl's logger, which TFDS logs through): drops `_NOTES`."""
    return not any(note in record.getMessage() for note in _NOTES)


FOLDER_FORM = f"{image_folder.LAYOUT}; a relative PATH written ./PATH"


def neither(name):
    """The one line for a --dataset that is no folder here and no name TFDS can parse (a mistyped folder: my-images)."""
    return ValueError(f"dataset {name!r} is neither a TFDS name (name[/config][:version]) nor an existing folder "
                      f"({FOLDER_FORM})")


def could_be_a_name(name):
    """Whether `name`'s dataset part is one word, as TFDS's `name[/config][:version]` needs: what tells a
    mistyped folder (my-images) from a dataset name where TFDS is not installed to ask."""
    return re.fullmatch(r"\w+", re.split(r"[/:]", name, maxsplit=1)[0]) is not None


def builder(name, data_dir=None):
    """`tfds.builder(name, data_dir)`; a name TFDS does not know is one line:
    an unknown dataset with the closest registered names (not TFDS's list of
    every dataset; not the community datasets either, whose index is fetched
    from the network), a name it cannot parse (a mistyped folder: my-images),
    a config or version the dataset lacks (TFDS's reason, without its wall of
    text or traceback). TFDS's `_NOTES` are left out of the log from here on."""
    import tensorflow_datasets as tfds

    logging.getLogger("absl").addFilter(_not_a_note)  # once: a filter is added once

    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        close = difflib.get_close_matches(name, tfds.list_builders(with_community_datasets=False), n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(close)}?" if close else f" Or {FOLDER_FORM}."
        raise ValueError(
            f"unknown dataset {name!r}: not a TFDS dataset (see tfds.list_builders()).{hint}"
        ) from None
    except (ValueError, AssertionError) as e:  # TFDS asserts a dataset's versions
        message = str(e)
        if message.startswith("Parsing builder name string"):
            raise neither(name) from None
        # 'Failed to construct dataset "x", builder_kwargs "{...}": <reason>[ Here are N BuilderConfigs ...: <close>]'
        reason, _, close = message.split('": ', 1)[-1].partition(" Here are ")
        close = close.partition(": ")[2].strip()
        reason = (reason.strip().splitlines() or [type(e).__name__])[0]  # one line, whatever TFDS said
        raise ValueError(f"dataset {name!r}: {reason}" + (f" Close: {close}." if close else "")) from None


def default_manual_dir(name):
    copy = LOCAL_COPIES.get(name)
    return copy.directory if copy else None


def prepare(builder, manual_dir=None):
    """Prepares `builder`'s dataset in its data_dir unless it already is;
    returns a builder to read it with."""
    if builder.is_prepared():
        return builder
    with _one_at_a_time(builder):
        if builder.is_prepared():  # another process prepared it while this one waited
            return _reopen(builder)
        return _prepare(builder, manual_dir)


@contextlib.contextmanager
def _one_at_a_time(builder):
    """An exclusive flock on ``<data_dir>/.<name>.prepare.lock``, waited for
    (none where data_dir is remote, gs:// and the like: no local file to lock)."""
    if "://" in str(builder.data_dir_root):
        yield
        return
    os.makedirs(builder.data_dir_root, exist_ok=True)
    with open(os.path.join(builder.data_dir_root, f".{builder.name}.prepare.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"Waiting for another process preparing {builder.name} in {builder.data_dir_root}.", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _prepare(builder, manual_dir):
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.download.download_manager import NonMatchingChecksumError

    original = builder
    name = builder.name
    manual_dir = manual_dir or default_manual_dir(name)
    url_infos = dict(type(builder).url_infos or {})
    local = bool(manual_dir and url_infos) and all(
        os.path.isfile(os.path.join(manual_dir, info.filename or "")) for info in url_infos.values()
    )
    if local:
        builder = _builder_for_local_files(builder, manual_dir, url_infos)
    elif builder.MANUAL_DOWNLOAD_INSTRUCTIONS and not (manual_dir and os.path.isdir(manual_dir)):
        raise ValueError(_advice(builder, manual_dir, "it must be downloaded by hand"))
    else:
        _check_reachable(builder, url_infos, manual_dir)
    config = tfds.download.DownloadConfig(manual_dir=manual_dir) if manual_dir else None
    source = f"its original files in {manual_dir}" if local else "a download"
    print(f"Preparing {name} once, from {source}, into {builder.data_dir} (TFDS writes its own format there: "
          "about a minute for Fashion-MNIST; later runs read it at once).", flush=True)
    try:
        builder.download_and_prepare(download_config=config)
    except (OSError, AssertionError, NonMatchingChecksumError, tfds.download.DownloadError) as e:
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        raise ValueError(_advice(builder, manual_dir, reason)) from e
    return builder if builder is original else _reopen(original)


def _reopen(builder):
    """`builder`'s class on its data_dir again: its info now read from disk."""
    kwargs = {"config": builder.builder_config} if builder.builder_config else {}
    return type(builder)(data_dir=builder.data_dir_root, version=builder.version, **kwargs)


def _check_reachable(builder, url_infos, manual_dir):
    hosts = {urllib.parse.urlsplit(url) for url in url_infos}
    for parts in sorted(hosts, key=lambda p: p.netloc)[:1]:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as e:
            raise ValueError(
                _advice(builder, manual_dir, f"its download host {parts.hostname} is unreachable ({e.__class__.__name__})")
            ) from None


def _advice(builder, manual_dir, reason):
    name = builder.name
    files = [info.filename for info in (type(builder).url_infos or {}).values() if info.filename]
    where = f"put its download files ({', '.join(sorted(files))})" if files else "put its files"
    copy = LOCAL_COPIES.get(name)
    get = f" (`{copy.how_to_get}` installs them in {copy.directory})" if copy else ""
    return (
        f"cannot prepare TFDS dataset {name!r} in {builder.data_dir_root}: {reason}. Either pass --data_dir=DIR "
        f"holding it prepared (`tfds build {name} --data_dir=DIR` where there is network), or {where} in "
        f"--manual_dir={manual_dir or 'DIR'}{get}."
    )


def _sha256(path):
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _builder_for_local_files(builder, manual_dir, url_infos):
    """The builder itself if the files are the original downloads; for a
    known copy (`LOCAL_COPIES`), the same builder class expecting the copy's
    checksums, so TFDS still verifies every file it reads."""
    from tensorflow_datasets.core.download import checksums

    copy = LOCAL_COPIES.get(builder.name)
    expected = {}
    for url, info in url_infos.items():
        path = os.path.join(manual_dir, info.filename)
        digest, size = _sha256(path)
        if digest == info.checksum:
            expected[url] = info
        elif copy and copy.sha256.get(info.filename) == digest:
            expected[url] = checksums.UrlInfo(size=size, checksum=digest, filename=info.filename)
        else:
            raise ValueError(
                f"{path} is neither the original {info.filename} (sha256 {info.checksum}) nor a known copy "
                f"of it: sha256 {digest}. Replace it with the file from {url}."
            )
    if expected == url_infos:
        return builder
    base = type(builder)

    class LocalCopyBuilder(base, skip_registration=True):
        name = base.name
        pkg_dir_path = base._get_pkg_dir_path()
        url_infos = expected

    LocalCopyBuilder.__module__ = base.__module__  # recorded in dataset_info.json
    kwargs = {"config": builder.builder_config} if builder.builder_config else {}
    return LocalCopyBuilder(data_dir=builder.data_dir_root, version=builder.version, **kwargs)
