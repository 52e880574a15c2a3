"""Webdataset shards (ImageNet-wds, img2dataset / CC12M-style tars) as a row-indexed dataset decoded when read.

A shard is a tar whose consecutive members ``<key>.<ext>`` form one sample (webdataset's rule: the key is the
member name up to the first dot of its file name; ``__key__``). :func:`prepare_shards` reads every shard once,
skipping over the image bytes and reading only the small members, and writes an index directory that holds no
pixels::

    index.npz      ids (N,) str = __key__; split (N,) str "train" (train shards) / "test" (test shards);
                   label_<attr> (N,) int64, -1 unknown;
                   shard (N,) int32 = position in manifest["shards"]; offset (N,) int64, nbytes (N,) int64 = where
                   the sample's image member's bytes lie in that tar
    manifest.json  {"kind": "webdataset", "storage": "shards", "shards": [{"url", "split", "num_samples",
                    "size", "mtime_ns"}], "num_samples", "num_train", "num_test", "image_size", "attributes",
                    "params", "digest", "max_skip_fraction", "id_scheme"}

Labels: a ``cls`` member (ImageNet-wds: the class index as text) gives attribute ``class``; every key of a ``json``
member named in ``label_fields`` (img2dataset writes one per sample) gives an attribute of that name. Each
attribute's values (over train and test together) are mapped to dense ints 0..C-1, in numeric order when every
value is an integer, else in text order; a sample without the value is -1.

:class:`ShardDataset` reads row r with one ``pread`` of the recorded byte range (O(1), no scan of the tar, no copy
of the shard: ``wids.ShardListDataset`` would index every tar's headers again in every worker and copy local
shards into its cache) and decodes it with the image-folder rule (:func:`contrastive.modalities.image.datasets.image_folder.
load_square_rgb`: EXIF rotation, RGB, centre square resized to ``image_size``), so an image gives the same pixels
whether it sits in a folder or in a shard. A broken member decodes to None and is skipped and counted by
:func:`contrastive.data.loading.iter_batches` like an unreadable file. Tar files are opened lazily in each process
(and thread), so the dataset pickles into DataLoader workers.

Sample ids are the ``__key__`` values. Keys must be unique within each split; when a train and a test shard share
keys (two img2dataset downloads both start at 000000000) every id becomes ``<split>/<key>`` (``"id_scheme":
"split/key"``).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tarfile
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from webdataset.tariterators import base_plus_ext

from contrastive.data.dataset import (INDEX_FILE, MANIFEST_FILE, _build_index, _write_json_atomic,
                                      atomic_dataset_dir, digest_array, is_index_prepared, params_hash, read_twice,
                                      save_index)
from contrastive.data.image_files import DEFAULT_MAX_SKIP_FRACTION, BrokenSample, IndexedImageDataset
from contrastive.data.skips import SkipCounter
from contrastive.data.urls import SHARD_IMAGE_EXTENSIONS, expand_urls, is_remote
from contrastive.errors import ConfigError, DataError

log = logging.getLogger(__name__)

STORAGE_SHARDS = "shards"
KIND = "webdataset"
FORMAT_VERSION = 1
CLASS_MEMBER = "cls"  # ImageNet-wds: the class index as text
CLASS_ATTRIBUTE = "class"
JSON_MEMBER = "json"
LOCATION_ARRAYS = ("shard", "offset", "nbytes")
NO_IMAGE = "no_image"  # SkipCounter reason of a sample without a jpg/jpeg/png/webp member (not indexed)
TAR_ERROR = "tar_error"  # ... of a tar that cannot be read on (the samples after it are not indexed)
SHARD_SKIP_FIX = ("re-download the broken shards (img2dataset --incremental, or copy the ImageNet-wds shards "
                  "again), or raise data.shards.max_skip_fraction")
_SCAN_THREADS = 8  # shards indexed at once (reading tar headers is I/O bound)
_OPEN_SHARDS_PER_THREAD = 16  # tar files a reading thread keeps open (ImageNet has over 1000 shards)
_COMPRESSED = (".gz", ".tgz", ".bz2", ".xz", ".zst", ".lz4")  # tars that cannot be read at a byte offset
_META = re.compile(r"__[^/]*__($|/)")  # webdataset skips such members (e.g. __index__)


# --------------------------------------------------------------------------------------------- shard lists
def resolve_shard_paths(spec: str | Sequence[str] | None, *, key: str) -> list[Path]:
    """Local shard paths of ``spec`` (brace patterns, several joined by '::', or a list of them), in order.

    ``key`` names the config key in messages (``data.shards.train_urls``). None or empty gives [].

    Raises:
        ConfigError: a remote URL (random access reads members by byte offset: shards must be local files).
        DataError: a shard does not exist (names it and the fix).
    """
    patterns = [spec] if isinstance(spec, str) else list(spec or [])
    if not any(str(p).replace("::", "").strip() for p in patterns):
        return []
    urls = expand_urls(patterns, check_local=False)
    remote = [u for u in urls if is_remote(u)]
    if remote:
        raise ConfigError(f"{key} names remote shards (e.g. {remote[0]}): the unimodal pipeline reads samples by "
                          "byte offset and needs local files; download or mount them and list the local paths")
    paths = [Path(u.removeprefix("file:")).expanduser() for u in urls]
    compressed = [p for p in paths if p.name.lower().endswith(_COMPRESSED)]
    if compressed:
        raise ConfigError(f"{key} names compressed shards (e.g. {compressed[0]}): samples are read by byte offset, "
                          "which needs plain .tar files; decompress them (gunzip) and list the .tar files")
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} of {len(paths)} shards of {key} do not exist (e.g. {missing[0]}): fix the "
                        f"path or pattern in {key}, or download the shards (img2dataset, ImageNet-wds)")
    return [p.resolve() for p in paths]


def _fingerprint(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"url": str(path), "size": int(stat.st_size), "mtime_ns": int(stat.st_mtime_ns)}


# --------------------------------------------------------------------------------------------- scanning
@dataclass
class _Sample:
    key: str
    images: dict[str, tuple[int, int]] = field(default_factory=dict)  # ext -> (data offset, size)
    cls: bytes | None = None
    json: bytes | None = None

    def image(self) -> tuple[int, int] | None:
        return next((self.images[e] for e in SHARD_IMAGE_EXTENSIONS if e in self.images), None)


@dataclass
class _Scanned:
    """One shard's indexed samples: keys, image locations, raw label values (text or None): ``classes`` from the
    cls members, ``columns`` (label field -> values) from the json members."""

    columns: dict[str, list[str | None]]
    classes: list[str | None] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    bad_json: int = 0
    json_fields: set[str] = field(default_factory=set)


def _label_text(value: Any) -> str | None:
    """A label value as text (None, empty: unknown); numbers and nested values as JSON."""
    if value is None:
        return None
    text = value.strip() if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text or None


def _scan_shard(path: Path, *, label_fields: Sequence[str], counter: SkipCounter) -> _Scanned:
    """Index one tar: every sample with an image member (its byte range), the labels of its cls / json members.

    The image bytes are seeked over, never read. Samples without an image are counted (``no_image``); a tar that
    cannot be read on is counted once (``tar_error``) and keeps the samples before the damage.
    """
    out = _Scanned(columns={name: [] for name in label_fields})

    def flush(sample: _Sample | None) -> None:
        if sample is None:
            return
        location = sample.image()
        if location is None:
            counter.skip(reason=NO_IMAGE, key=sample.key, url=str(path),
                         detail=f"no {'/'.join(SHARD_IMAGE_EXTENSIONS)} member; not indexed")
            return
        payload: dict = {}
        if sample.json is not None and label_fields:
            try:
                payload = json.loads(sample.json)
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
            except ValueError:
                payload = {}
                out.bad_json += 1
            out.json_fields.update(payload)
        cls = None if sample.cls is None else sample.cls.decode("utf-8", errors="replace")
        out.classes.append(_label_text(cls))
        for name in label_fields:
            out.columns[name].append(_label_text(payload.get(name)))
        out.keys.append(sample.key)
        out.offsets.append(location[0])
        out.nbytes.append(location[1])
        counter.ok()

    current: _Sample | None = None
    try:
        with tarfile.open(path, mode="r:") as tar:
            while True:
                member = tar.next()
                if member is None:
                    break
                if not member.isreg() or _META.match(member.name):
                    continue
                prefix, ext = base_plus_ext(member.name)
                if prefix is None:
                    continue
                ext = ext.lower()
                if current is None or prefix != current.key:
                    flush(current)
                    current = _Sample(key=prefix)
                if ext in SHARD_IMAGE_EXTENSIONS:
                    current.images.setdefault(ext, (int(member.offset_data), int(member.size)))
                elif ext == CLASS_MEMBER:
                    current.cls = tar.extractfile(member).read()
                elif ext == JSON_MEMBER and label_fields:
                    current.json = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as err:
        counter.skip(reason=TAR_ERROR, key=current.key if current else "?", url=str(path),
                     detail=f"{type(err).__name__}: {err}; the samples after it are not indexed")
    flush(current)
    return out


def _dense_labels(columns: Mapping[str, list[str | None]],
                  ) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    """attr -> class names and attr -> int64 (N,) labels (-1 unknown): numeric order if all values are ints."""
    names_by_attr, labels = {}, {}
    for attr, column in columns.items():
        names = sorted({c for c in column if c is not None})
        if names and all(re.fullmatch(r"[+-]?\d+", n) for n in names):
            names.sort(key=int)
        lookup = {name: i for i, name in enumerate(names)}
        names_by_attr[attr] = names
        labels[attr] = np.asarray([-1 if c is None else lookup[c] for c in column], dtype=np.int64)
    return names_by_attr, labels


def _unique_ids(keys: list[str], split: list[str], *, shards: list[str], shard_of: np.ndarray,
                ) -> tuple[list[str], str]:
    """(ids, scheme): the keys when unique, else ``<split>/<key>`` when only a train and a test key meet."""
    for name in ("train", "test"):
        seen: dict[str, int] = {}
        for row, (key, s) in enumerate(zip(keys, split)):
            if s != name:
                continue
            if key in seen:
                first, second = shards[shard_of[seen[key]]], shards[shard_of[row]]
                raise DataError(f"sample key {key!r} occurs twice among the {name} shards ({first} and {second}): "
                                "a shard is listed twice, or the shards of two downloads are mixed; list each "
                                "shard once (give different downloads different key prefixes)")
            seen[key] = row
    if len(set(keys)) == len(keys):
        return list(keys), "key"
    log.warning("train and test shards share sample keys (e.g. two img2dataset downloads): the sample ids are "
                "'<split>/<key>'")
    return [f"{s}/{k}" for k, s in zip(keys, split)], "split/key"


# --------------------------------------------------------------------------------------------- digest
def shard_index_digest(*, index: Mapping[str, np.ndarray], params: Mapping[str, Any]) -> str:
    """sha256 hex of a shard index without reading a pixel: the shards (paths, sizes, mtimes), image size and
    label fields (``params`` but ``max_skip_fraction``, which changes no sample) and every index array."""
    digest = hashlib.sha256()
    identity = {k: v for k, v in params.items() if k != "max_skip_fraction"}
    digest.update(("shards|" + json.dumps(identity, sort_keys=True, separators=(",", ":"))).encode())
    for name in sorted(index):
        digest.update(f"|{name}|".encode())
        digest_array(digest, index[name])
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------- prepare
def prepare_shards(*, train_urls: str | Sequence[str], test_urls: str | Sequence[str] | None, root: Path,
                   image_size: int, label_fields: Sequence[str] = (),
                   max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION) -> Path:
    """Index webdataset shards into ``root / "shards-<hash>"`` (no pixels), or reuse the index of the same shards.

    The cache key covers every shard's path, size and mtime, the image size, the label fields and
    ``max_skip_fraction``: a re-downloaded shard is indexed again (its byte offsets may have moved).

    Args:
        train_urls: the training shards: local paths or brace patterns (``/data/imagenet/train-{0000..1023}.tar``),
            several joined by '::', or a list of them.
        test_urls: the test shards (split "test"), the same way; None or empty: no test split.
        root: where prepared datasets live.
        image_size: side of the decoded images (shorter side resized, centre square).
        label_fields: keys of each sample's ``json`` member that become attributes (a ``cls`` member always
            gives attribute ``class``).
        max_skip_fraction: largest share of samples without an image member (or lost to a broken tar) tolerated
            while indexing; also the threshold readers of the dataset use for undecodable images.

    Returns:
        The dataset directory, ready for :func:`contrastive.data.loading.load_dataset` (a :class:`ShardDataset`).

    Raises:
        ConfigError: remote URLs, no train shards, a shard in both lists, or a label field named ``class`` next
            to ``cls`` members.
        DataError: a shard does not exist, a key occurs twice in a split, a label field is in no sample's json, no
            sample has an image, or more than ``max_skip_fraction`` of the samples are broken.
    """
    label_fields = [str(f) for f in label_fields]
    if len(set(label_fields)) != len(label_fields):
        raise ConfigError(f"data.shards.label_fields lists a field twice: {label_fields}")
    train = resolve_shard_paths(train_urls, key="data.shards.train_urls")
    test = resolve_shard_paths(test_urls, key="data.shards.test_urls")
    if not train:
        raise ConfigError("no training shards: set data.shards.train_urls to a pattern such as "
                          "/data/imagenet/imagenet1k-train-{0000..1023}.tar")
    both = sorted(set(train) & set(test))
    if both:
        raise ConfigError(f"{len(both)} shard(s) are both training and test shards (e.g. {both[0]}): a sample must "
                          "be in one split; fix data.shards.train_urls / test_urls")
    params = {"format_version": FORMAT_VERSION, "image_size": int(image_size), "label_fields": label_fields,
              "train": [_fingerprint(p) for p in train], "test": [_fingerprint(p) for p in test],
              "max_skip_fraction": float(max_skip_fraction)}
    target = Path(root) / f"shards-{params_hash(params)}"

    def prepared(directory: Path) -> bool:
        return is_index_prepared(directory, params=params, storage=STORAGE_SHARDS, arrays=LOCATION_ARRAYS)

    if prepared(target):
        return target
    with atomic_dataset_dir(target, keep_existing=prepared) as tmp:
        _write_shard_index(tmp, shards=[*train, *test], num_train_shards=len(train), params=params)
    return target


def _write_shard_index(tmp: Path, *, shards: list[Path], num_train_shards: int, params: dict) -> None:
    label_fields = params["label_fields"]
    counter = SkipCounter(max_skip_fraction=params["max_skip_fraction"], where=f"indexing {len(shards)} shards",
                          fix=SHARD_SKIP_FIX)
    with ThreadPoolExecutor(max_workers=min(_SCAN_THREADS, len(shards)), thread_name_prefix="shard-index") as pool:
        scanned = list(pool.map(lambda p: _scan_shard(p, label_fields=label_fields, counter=counter), shards))
    counter.check()
    keys, split, offsets, nbytes, shard_of = [], [], [], [], []
    classes: list[str | None] = []
    columns: dict[str, list[str | None]] = {name: [] for name in label_fields}
    for i, result in enumerate(scanned):
        keys += result.keys
        split += ["train" if i < num_train_shards else "test"] * len(result.keys)
        classes += result.classes
        for attr, column in result.columns.items():
            columns[attr] += column
        offsets += result.offsets
        nbytes += result.nbytes
        shard_of += [i] * len(result.keys)
    if "train" not in split:
        raise DataError(f"no sample of the {num_train_shards} training shards (e.g. {shards[0]}) has an image "
                        f"member ({', '.join(SHARD_IMAGE_EXTENSIONS)}): are these image shards? Fix data.shards.train_urls")
    bad_json = sum(r.bad_json for r in scanned)
    if bad_json:
        log.warning("%d sample(s) have a json member that is not a JSON object: their %s labels are unknown (-1)",
                    bad_json, ", ".join(label_fields))
    has_cls = any(c is not None for c in classes)
    if has_cls and CLASS_ATTRIBUTE in label_fields:
        raise ConfigError(f"the shards' {CLASS_MEMBER} members already give attribute {CLASS_ATTRIBUTE!r}: drop "
                          f"{CLASS_ATTRIBUTE!r} from data.shards.label_fields")
    fields_seen = set().union(*(r.json_fields for r in scanned))
    absent = [f for f in label_fields if f not in fields_seen]
    if absent:
        raise DataError(f"label field(s) {absent} are in no sample's json member of the shards (fields seen: "
                        f"{sorted(fields_seen)[:20]}): fix data.shards.label_fields")
    if has_cls:  # attribute "class" first, then the json fields in the order given
        columns = {CLASS_ATTRIBUTE: classes, **columns}
    attributes, labels = _dense_labels(columns)
    urls = [str(p) for p in shards]
    shard_arr = np.asarray(shard_of, dtype=np.int32)
    ids, id_scheme = _unique_ids(keys, split, shards=urls, shard_of=shard_arr)
    index = _build_index(ids=ids, split=split, labels=labels, attributes=attributes, num_samples=len(ids))
    index.update({"shard": shard_arr, "offset": np.asarray(offsets, dtype=np.int64),
                  "nbytes": np.asarray(nbytes, dtype=np.int64)})
    save_index(tmp / INDEX_FILE, index)
    counts = np.bincount(shard_arr, minlength=len(shards))
    fingerprints = params["train"] + params["test"]
    manifest = {
        "kind": KIND,
        "storage": STORAGE_SHARDS,
        "shards": [{**fp, "split": "train" if i < num_train_shards else "test", "num_samples": int(counts[i])}
                   for i, fp in enumerate(fingerprints)],
        "num_samples": len(ids),
        "num_train": int(np.count_nonzero(index["split"] == "train")),
        "num_test": int(np.count_nonzero(index["split"] == "test")),
        "image_size": int(params["image_size"]),
        "attributes": {attr: [str(n) for n in names] for attr, names in attributes.items()},
        "params": params,
        "digest": shard_index_digest(index=index, params=params),
        "max_skip_fraction": float(params["max_skip_fraction"]),
        "id_scheme": id_scheme,
        "skipped": counter.stats(),
    }
    _write_json_atomic(tmp / MANIFEST_FILE, manifest)
    skipped = sum(counter.skipped.values())
    if skipped:
        log.warning("indexed %d samples of %d shards; skipped %d broken (%s)", len(ids), len(shards), skipped,
                    dict(counter.skipped))



# --------------------------------------------------------------------------------------------- reading
class ShardDataset(IndexedImageDataset):
    """Webdataset shards indexed by :func:`prepare_shards` (storage "shards"): rows decoded from tar members.

    Attributes:
        shards: the tar paths, in manifest order (``shard_index`` refers to them).
        shard_index: int32 (N,) shard of each row; offsets, nbytes: int64 (N,) byte range of its image member.
    """

    storage = STORAGE_SHARDS
    skip_fix = SHARD_SKIP_FIX
    _RUNTIME = (*IndexedImageDataset._RUNTIME, "_local", "_pid")

    def __init__(self, *, path: Path, index: Mapping[str, np.ndarray], manifest: Mapping[str, Any],
                 max_skip_fraction: float | None = None) -> None:
        self.shards: list[str] = [str(s["url"]) for s in manifest["shards"]]
        self.shard_index: np.ndarray = index["shard"]
        self.offsets: np.ndarray = index["offset"]
        self.nbytes: np.ndarray = index["nbytes"]
        super().__init__(path=path, index=index, manifest=manifest, max_skip_fraction=max_skip_fraction)

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._local = threading.local()  # per thread: shard -> open file, least recently used first
        self._pid = os.getpid()

    @classmethod
    def load(cls, path: Path, *, verify_digest: bool = False,
             max_skip_fraction: float | None = None) -> "ShardDataset":
        """Open a directory written by :func:`prepare_shards`.

        Args:
            path: the dataset directory.
            verify_digest: re-hash the index and compare with the manifest (reads no tar).
            max_skip_fraction: threshold of :attr:`skips`; None = the one given to :func:`prepare_shards`.

        Raises:
            DataError: a file of the index is missing or damaged, or a shard is gone or changed since it was
                indexed (its byte offsets would be wrong).
        """
        manifest, index, fix = cls.read_index(path, extra_arrays=LOCATION_ARRAYS, required=("shards",))
        shards = manifest["shards"]
        if index["shard"].size and (index["shard"].min() < 0 or index["shard"].max() >= len(shards)):
            raise DataError(f"{Path(path) / INDEX_FILE}: shard numbers outside the {len(shards)} shards: {fix}")
        missing = [s for s in shards if not Path(s["url"]).is_file()]
        if missing:
            raise DataError(f"shard {missing[0]['url']} that dataset {path} indexes no longer exists"
                            f"{f' (nor {len(missing) - 1} more)' if len(missing) > 1 else ''}: restore it, or "
                            f"point data.shards.{missing[0]['split']}_urls at its new place and run again")
        for shard in shards:
            shard_path = Path(shard["url"])
            now = _fingerprint(shard_path)
            if (now["size"], now["mtime_ns"]) != (shard["size"], shard["mtime_ns"]):
                raise DataError(f"shard {shard_path} changed after dataset {path} indexed it (size or mtime): run "
                                "`mclpipe run` again to index the shards anew")
        dataset = cls(path=path, index=index, manifest=manifest, max_skip_fraction=max_skip_fraction)
        if verify_digest:
            dataset.verify_digest()
        return dataset

    def compute_digest(self) -> str:
        index = self.index_arrays()
        index.update({"shard": self.shard_index, "offset": self.offsets, "nbytes": self.nbytes})
        return shard_index_digest(index=index, params=self.manifest["params"])

    @property
    def origin(self) -> str:
        return f"{len(self.shards)} shards ({self.shards[0]}, ...)" if self.shards else "no shards"

    def location(self, row: int) -> tuple[str, int, int]:
        """(shard path, byte offset, byte count) of ``row``'s image member."""
        row = int(row)
        return self.shards[int(self.shard_index[row])], int(self.offsets[row]), int(self.nbytes[row])

    def skip_url(self, row: int) -> str:
        return self.shards[int(self.shard_index[int(row)])]

    def image_bytes(self, row: int) -> bytes:
        """The encoded image of ``row`` as stored in its shard; BrokenSample when the shard ends before it does,
        DataReadError when the shard cannot be read (an I/O error, twice)."""
        row = int(row)
        shard, offset, size = int(self.shard_index[row]), int(self.offsets[row]), int(self.nbytes[row])
        data = read_twice(lambda: os.pread(self._file(shard).fileno(), size, offset), path=self.shards[shard],
                          what="the shard", on_retry=lambda: self._forget(shard))
        if len(data) != size:
            raise BrokenSample(f"truncated tar member: {len(data)} of {size} bytes at offset {offset}")
        return data

    def _forget(self, shard: int) -> None:
        """Drop this thread's open file of ``shard`` (opened again on the next read)."""
        files = getattr(self._local, "files", None)
        if files is not None and shard in files:
            files.pop(shard).close()

    def open_image(self, row: int) -> io.BytesIO:
        return io.BytesIO(self.image_bytes(row))

    def _file(self, shard: int):
        """This thread's open file of ``shard`` (opened on first use; at most a few per thread stay open)."""
        if self._pid != os.getpid():  # a fork after files were opened: never share them with the parent
            self._local, self._pid = threading.local(), os.getpid()
        files: OrderedDict | None = getattr(self._local, "files", None)
        if files is None:
            files = self._local.files = OrderedDict()
        handle = files.get(shard)
        if handle is None:
            handle = files[shard] = open(self.shards[shard], "rb", buffering=0)  # noqa: SIM115 - kept open
            while len(files) > _OPEN_SHARDS_PER_THREAD:
                files.popitem(last=False)[1].close()
        else:
            files.move_to_end(shard)
        return handle

