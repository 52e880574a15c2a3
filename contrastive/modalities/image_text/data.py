"""Image-text webdataset shards as img2dataset writes them, read tolerantly; and a writer of tiny test shards.

A shard is a tar file whose members ``<key>.jpg|png|webp``, ``<key>.txt`` and ``<key>.json`` form one sample
(webdataset groups consecutive members by ``__key__``, the name before the first dot). img2dataset writes one
``<shard>_stats.json`` per shard (with ``successes``); open_clip's convention is one ``sizes.json`` mapping shard file
names to sample counts. URLs are brace patterns (``/data/cc12m/{00000..01242}.tar``), several joined by ``::``,
local paths or anything webdataset opens (``pipe:cmd``, ``http(s)://``, ``gs://``); ``s3://bucket/key`` is read
through ``pipe:aws s3 cp s3://bucket/key -``.

Web-crawled data has broken samples: a truncated JPEG, a sample without caption. They are skipped, counted by
reason, logged (the first few, then every 1000th), and the run fails with DataError only when their fraction
exceeds ``max_skip_fraction``: a few bad samples should not stop a 12M-sample run, a broken download should. The
counting is :class:`contrastive.data.skips.SkipCounter`, shared with the image-folder reader.
"""
from __future__ import annotations

import io
import itertools
import json
import logging
import os
import re
import shutil
import tarfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
import webdataset as wds
from PIL import Image

from contrastive.modalities.image_text.keyed_transform import KeyedTransform, normalize_batch
from contrastive.data.urls import SHARD_IMAGE_EXTENSIONS, is_remote, to_webdataset_url
from contrastive.data.workers import ClosedOnExit, OrderedWorkers, result_tensor
from contrastive.data.skips import SkipCounter
from contrastive.errors import ConfigError, DataError

log = logging.getLogger(__name__)

CAPTION_EXTENSION = "txt"
SIZES_FILE = "sizes.json"
STATS_SUFFIX = "_stats.json"


# ---------------------------------------------------------------------------------------------------- counts
@dataclass
class SampleCount:
    """Sample counts of a list of shards. per_shard: url -> count where known. source: where the counts came from."""

    total: int
    per_shard: dict[str, int]
    source: str


def _count_from_sizes(urls: list[str]) -> dict[str, int] | None:
    directories = {os.path.dirname(u) for u in urls}
    sizes: dict[str, int] = {}
    for directory in directories:
        path = Path(directory) / SIZES_FILE
        if not path.is_file():
            return None
        sizes.update({os.path.join(directory, name): int(n) for name, n in json.loads(path.read_text()).items()})
    if not all(u in sizes for u in urls):
        return None
    return {u: sizes[u] for u in urls}


def _count_from_stats(urls: list[str]) -> dict[str, int] | None:
    counts = {}
    for url in urls:
        stats = Path(url.removesuffix(".tar") + STATS_SUFFIX)
        if not stats.is_file():
            return None
        payload = json.loads(stats.read_text())
        counts[url] = int(payload.get("successes", payload.get("count", 0)))
    return counts


def count_samples(urls: list[str], *, num_samples: int | None = None) -> SampleCount:
    """Samples in ``urls``: ``num_samples`` if given, else ``sizes.json`` beside the shards, else img2dataset's
    ``<shard>_stats.json`` ("successes"). Broken samples inside a shard are still counted here (they are found
    only when read). Raises DataError naming ``data.num_samples`` when neither is available (remote shards)."""
    if num_samples is not None:
        return SampleCount(total=int(num_samples), per_shard={}, source="config")
    local = [u.removeprefix("file:") for u in urls if not is_remote(u)]
    if len(local) == len(urls):
        for source, reader in ((SIZES_FILE, _count_from_sizes), (f"*{STATS_SUFFIX}", _count_from_stats)):
            per_shard = reader(local)
            if per_shard is not None:
                return SampleCount(total=sum(per_shard.values()), per_shard=per_shard, source=source)
    raise DataError(f"cannot tell how many samples {len(urls)} shards hold (no {SIZES_FILE} or {STATS_SUFFIX} "
                    "files beside local shards): set data.num_samples")


def data_fingerprint(urls: list[str]) -> list:
    """Identity of a shard list for content keys: (url, size, mtime_ns) for local files, the URL for remote ones."""
    out: list = []
    for url in urls:
        path = Path(url.removeprefix("file:"))
        if not is_remote(url) and path.is_file():
            stat = path.stat()
            out.append([url, stat.st_size, stat.st_mtime_ns])
        else:
            out.append([url])
    return out


# ---------------------------------------------------------------------------------------------------- skipping
class BadSample(Exception):
    """A sample that cannot be used; ``reason`` is a short counter name (bad_image, no_caption, ...)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def decode_image_text(sample: dict) -> tuple[Image.Image, str]:
    """(RGB PIL image, caption) of a raw webdataset sample; BadSample for a missing/undecodable image or caption."""
    image_bytes = next((sample[e] for e in SHARD_IMAGE_EXTENSIONS if e in sample), None)
    if image_bytes is None:
        raise BadSample("no_image", f"members {sorted(k for k in sample if not k.startswith('__'))}")
    caption = sample.get(CAPTION_EXTENSION)
    if caption is None:
        raise BadSample("no_caption")
    try:
        text = caption.decode("utf-8").strip() if isinstance(caption, bytes) else str(caption).strip()
    except UnicodeDecodeError as exc:
        raise BadSample("bad_caption", str(exc)) from None
    if not text:
        raise BadSample("no_caption", "empty")
    try:
        image = Image.open(io.BytesIO(image_bytes))
        image.load()  # decoding is lazy: force it so a truncated file fails here, not in a worker later
        image = image.convert("RGB")
    except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, DecompressionBombError
        raise BadSample("bad_image", f"{type(exc).__name__}: {exc}") from None
    return image, text


# ---------------------------------------------------------------------------------------------------- reading
def _tar_error_handler(counter: SkipCounter | None) -> Callable[[Exception], bool]:
    def handle(exn: Exception) -> bool:
        if counter is not None:
            counter.skip(reason="tar_error", key="?", detail=f"{type(exn).__name__}: {str(exn)[:200]}")
        else:
            log.warning("skipping unreadable tar content: %s", exn)
        return True  # continue with the next member / shard
    return handle


def iter_raw_samples(urls: Sequence[str], *, counter: SkipCounter | None = None) -> Iterator[dict]:
    """Raw samples {"__key__", "__url__", ext: bytes} of the shards in order; tar-level errors are counted
    (reason ``tar_error``) and reading goes on with what follows."""
    pipeline = wds.DataPipeline(wds.SimpleShardList([to_webdataset_url(u) for u in urls]),
                                wds.tarfile_to_samples(handler=_tar_error_handler(counter)))
    yield from pipeline


class _SkipRecord:
    """A :class:`SkipCounter` stand-in for a worker: it keeps the skips, for the reading process to count."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str, str, str]] = []

    def skip(self, *, reason: str, key: str, url: str = "", detail: str = "") -> None:
        self.skipped.append((reason, key, url, detail))


@dataclass
class ShardIndex:
    """A shard's raw samples as :func:`iter_raw_samples` yields them, with each member of a local uncompressed tar
    as its (offset, size) in the file instead of its bytes (other shards: the bytes); and its tar-level skips as
    (reason, key, url, detail)."""
    samples: list[dict]
    skipped: list[tuple[str, str, str, str]]


def index_shard(url: str) -> ShardIndex:
    """The samples of one shard, read by a worker so that the reading process never parses a tar: webdataset's own
    grouping and error handling over the members (:func:`_member_refs`), each member's bytes left in the file as
    (offset, size), read by the decoder that needs them (:func:`_with_member_bytes`). A shard that is remote or
    compressed comes back with its bytes (:func:`iter_raw_samples`)."""
    record = _SkipRecord()
    handler = _tar_error_handler(record)
    path = None if is_remote(url) else url.removeprefix("file:")
    samples = None if path is None else _indexed_samples(path=path, url=url, handler=handler)
    if samples is None:
        samples = list(iter_raw_samples([url], counter=record))
    return ShardIndex(samples=samples, skipped=record.skipped)


def _indexed_samples(*, path: str, url: str, handler: Callable[[Exception], bool]) -> list[dict] | None:
    """The samples of the uncompressed tar ``path`` with (offset, size) members; None when it is compressed."""
    from webdataset.tariterators import group_by_keys

    def members() -> Iterator[dict]:  # webdataset's url_opener + tar_file_expander for one local file
        try:
            with open(path, "rb") as handle:
                stream = tarfile.open(fileobj=handle, mode="r|*")
                if getattr(stream.fileobj, "comptype", "tar") != "tar":
                    raise _Compressed
                for member in _member_refs(stream, handler=handler):
                    member["__url__"] = url
                    yield member
            yield {}  # the end of the shard: its last sample is complete
        except _Compressed:
            raise
        except Exception as exn:  # noqa: BLE001 - as webdataset: the handler counts it, reading goes on
            handler(exn)
    try:
        return list(group_by_keys(members(), handler=handler))
    except _Compressed:
        return None


class _Compressed(Exception):
    """A shard whose members have no byte offsets in the file (a compressed tar)."""


def _member_refs(stream: tarfile.TarFile, *, handler: Callable[[Exception], bool]) -> Iterator[dict]:
    """webdataset 1.x's ``tar_file_iterator`` (the same members kept, the same errors raised where it raises them:
    the data is read as there, so a cut member fails alike), each member's data as (offset, size) in the file."""
    from webdataset.tariterators import meta_prefix, meta_suffix

    for tarinfo in stream:
        fname = tarinfo.name
        try:
            if not tarinfo.isreg() or fname is None:
                continue
            if "/" not in fname and fname.startswith(meta_prefix) and fname.endswith(meta_suffix):
                continue
            if re.match(r"__[^/]*__($|/)", fname):
                continue
            data = stream.extractfile(tarinfo).read()
            yield {"fname": fname, "data": (tarinfo.offset_data, len(data))}
            stream.members = []
        except Exception as exn:  # noqa: BLE001 - as webdataset
            if not handler(exn):
                break


def _with_member_bytes(sample: dict, files: dict[str, Any]) -> dict:
    """``sample`` with its (offset, size) members read from the tar file ``__url__`` names (one read of the span
    they cover: a sample's members are consecutive); ``files`` caches open files by path."""
    refs = {name: value for name, value in sample.items() if isinstance(value, tuple)}
    if not refs:
        return sample
    path = sample["__url__"].removeprefix("file:")
    if path not in files:
        if len(files) >= 16:
            for handle in files.values():
                os.close(handle)
            files.clear()
        files[path] = os.open(path, os.O_RDONLY)
    start = min(offset for offset, _ in refs.values())
    span = os.pread(files[path], max(offset + size for offset, size in refs.values()) - start, start)
    return {**sample, **{name: span[offset - start:offset - start + size] for name, (offset, size) in refs.items()}}


def shuffled(items: Iterable, *, buffer: int, rng: np.random.Generator) -> Iterator:
    """Approximate shuffle with a bounded buffer (like webdataset's shuffle, but seeded for exact resumption)."""
    if buffer <= 1:
        yield from items
        return
    pool: list = []
    for item in items:
        if len(pool) < buffer:
            pool.append(item)
            continue
        j = int(rng.integers(len(pool)))
        pool[j], item = item, pool[j]
        yield item
    order = rng.permutation(len(pool))
    for j in order:
        yield pool[j]


@dataclass
class ClipBatch:
    """images: float (B, 3, S, S) transformed; texts: B captions; keys: B sample keys (``__key__``);
    group: the pseudo-label group of a cluster-pure batch, -1 for a random batch; tokens: int64 (B, context) of
    the captions when the reader tokenised them (off the training thread, :func:`ready_for_step`), else None;
    normalization: (mean, std) when ``images`` are uint8 still to be normalised (:func:`normalize_batch`, on the
    device in the step), None when they are the transform's floats."""

    images: torch.Tensor
    texts: list[str]
    keys: list[str]
    group: int = -1
    tokens: torch.Tensor | None = None
    normalization: tuple | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, n: int) -> "ClipBatch":
        return ClipBatch(images=self.images[:n], texts=self.texts[:n], keys=self.keys[:n], group=self.group,
                         tokens=None if self.tokens is None else self.tokens[:n], normalization=self.normalization)

    def float_images(self) -> torch.Tensor:
        """The transform's float images (B, 3, S, S): ``images`` normalised here when they are uint8."""
        return self.images if self.normalization is None else normalize_batch(self.images, self.normalization)


def ready_for_step(batch: ClipBatch, *, tokenizer: Callable[[list[str]], torch.Tensor], pin_memory: bool,
                   normalize: bool = True) -> ClipBatch:
    """The batch as the step takes it, made by the reading thread: captions tokenised (unless the decode workers
    did: :class:`SampleDecoder` with a tokenizer), uint8 images normalised when
    ``normalize`` (a CPU stage; a GPU stage leaves that to the step, on the device), images (and tokens) in pinned
    memory when ``pin_memory`` (CUDA: the copy to the GPU is then asynchronous)."""
    if normalize and batch.normalization is not None:
        batch.images, batch.normalization = batch.float_images(), None
    if batch.tokens is None:
        batch.tokens = tokenizer(batch.texts)
    if pin_memory:
        batch.images, batch.tokens = batch.images.pin_memory(), batch.tokens.pin_memory()
    return batch


@dataclass
class DecodedChunk:
    """The good samples of a chunk of raw samples, in order: keys, captions, images stacked (n, 3, S, S) (uint8 or
    float; None when n = 0), the captions' int64 (n, context) tokens when the decoder tokenises, and the skipped
    samples as (reason, key, url, detail)."""
    keys: list[str]
    texts: list[str]
    images: torch.Tensor | None
    skipped: list[tuple[str, str, str, str]]
    tokens: torch.Tensor | None = None

    def part(self, start: int, stop: int) -> "DecodedChunk":
        """The good samples start..stop (views of the tensors; no skips)."""
        return DecodedChunk(keys=self.keys[start:stop], texts=self.texts[start:stop],
                            images=self.images[start:stop], skipped=[],
                            tokens=None if self.tokens is None else self.tokens[start:stop])


class SampleDecoder:
    """(epoch, raw samples) -> :class:`DecodedChunk`: decode each image and caption, transform the image. It pickles
    (decode workers run it).

    seed: training decoders pass the stage seed, so each sample's augmentation is drawn from (seed, epoch, key)
    (:class:`contrastive.modalities.image_text.keyed_transform.KeyedTransform`), whatever the process that decodes
    it. None (export, evaluation): the transform is deterministic and runs as it is. uint8 (with a seed): images stop
    before ToTensor + Normalize, uint8; :attr:`normalization` says how to finish them (None: they are floats).
    tokenizer (list[str] -> int64 (n, context)): the captions are tokenised here too, as open_clip's DataLoader
    workers do, so the reading thread, which shares the GIL with the training thread, does not."""

    def __init__(self, transform: Callable, *, seed: int | None = None, uint8: bool = False,
                 tokenizer: Callable[[list[str]], torch.Tensor] | None = None):
        self.transform, self.seed, self.uint8, self.tokenizer = transform, seed, uint8, tokenizer
        self.normalization = None if seed is None else \
            KeyedTransform(transform, seed=seed, epoch=0, uint8=uint8).normalization
        self._keyed: dict[int, KeyedTransform] = {}
        self._files: dict[str, int] = {}  # shards open for reading members (:func:`_with_member_bytes`)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_keyed": {}, "_files": {}}

    def _transform(self, epoch: int) -> Callable[[Image.Image, str], torch.Tensor]:
        if self.seed is None:
            return lambda image, _key: self.transform(image)
        if epoch not in self._keyed:
            self._keyed = {epoch: KeyedTransform(self.transform, seed=self.seed, epoch=epoch, uint8=self.uint8)}
        return self._keyed[epoch]

    def __call__(self, work: tuple[int, list[dict]]) -> DecodedChunk:
        epoch, samples = work
        transform = self._transform(epoch)
        keys, texts, images, skipped = [], [], [], []
        for sample in samples:
            key, url = sample.get("__key__", "?"), sample.get("__url__", "")
            try:
                image, text = decode_image_text(_with_member_bytes(sample, self._files))
                tensor = transform(image, key)
            except BadSample as bad:
                skipped.append((bad.reason, key, url, bad.detail))
                continue
            except Exception as exc:  # noqa: BLE001 - a transform failing on one odd image must not stop the run
                skipped.append(("bad_image", key, url, f"transform: {type(exc).__name__}: {exc}"))
                continue
            keys.append(key)
            texts.append(text)
            images.append(tensor)
        stacked = torch.stack(images, out=result_tensor((len(images), *images[0].shape), dtype=images[0].dtype)
                              ) if images else None
        return DecodedChunk(keys=keys, texts=texts, images=stacked, skipped=skipped,
                            tokens=self.tokenizer(texts) if self.tokenizer is not None and texts else None)


class SampleDecodePool(ClosedOnExit):
    """Decodes raw samples with a :class:`SampleDecoder` in ``workers`` processes
    (:class:`contrastive.data.workers.OrderedWorkers`; 0: in the calling thread), in order, a chunk of samples a
    task; counts the skipped ones in the caller's :class:`SkipCounter`. A stage keeps one for all its epochs (the
    workers start once); close it (or use it as a context manager) to end them.

    Processes, not threads: on a GPU host decode threads contend for the GIL with the reading and training threads
    (H200, ViT-B-32: 12 decode threads read slower than 4, while open_clip_train's 12 worker processes read 1.4x
    faster than its 4; BENCHMARKS.md).

    With workers, the reading process (the thread that feeds training, which shares its GIL) does no per-member
    work: one more worker process reads the shards' tar headers (:func:`index_shard`, a message a shard), the
    reading process shuffles and plans samples by reference, each decode worker reads the bytes of the samples it
    is handed and returns a whole batch in shared memory, which becomes the step's batch as it is (no copy) unless
    a skipped sample shifted it (:meth:`batches`)."""

    def __init__(self, decoder: SampleDecoder, *, workers: int):
        self.decoder = decoder
        preload = ("open_clip", "contrastive.modalities.image_text.data")
        self.pool = OrderedWorkers(decoder, workers=workers, setting="data.decode_workers", preload=preload)
        self.indexer = OrderedWorkers(index_shard, workers=1 if workers else 0, setting="data.decode_workers",
                                      preload=preload)

    @property
    def workers(self) -> int:
        return self.pool.workers

    def raw_samples(self, urls: Sequence[str], *, counter: SkipCounter) -> Iterator[dict]:
        """The raw samples of ``urls`` in order, as :func:`iter_raw_samples` yields them: with workers, indexed by
        the index worker (local members as (offset, size), read by the decoders), its tar-level skips counted here
        as each shard's index arrives."""
        if not self.workers:
            yield from iter_raw_samples(urls, counter=counter)
            return
        for index in self.indexer.map(urls):
            for reason, key, url, detail in index.skipped:
                counter.skip(reason=reason, key=key, url=url, detail=detail)
            yield from index.samples

    def chunks(self, chunks: Iterable[list[dict]], *, epoch: int, counter: SkipCounter) -> Iterator[DecodedChunk]:
        """Each chunk of raw samples decoded, in order; skipped samples counted (DataError past the threshold)."""
        for decoded in self.pool.map((epoch, chunk) for chunk in chunks):
            for reason, key, url, detail in decoded.skipped:
                counter.skip(reason=reason, key=key, url=url, detail=detail)
            counter.ok(len(decoded.keys))
            yield decoded

    def batches(self, raw: Iterable[dict], *, epoch: int, counter: SkipCounter, batch_size: int,
                keep_last: bool = False) -> Iterator[ClipBatch]:
        """The good samples of ``raw`` decoded, in order, in batches of exactly ``batch_size`` (a shorter last one
        with ``keep_last``), a batch's samples a task: one result message a batch whatever the number of workers.

        A task's result is the batch itself, its tensors in the worker's shared memory: no copy in the reading
        process. A task that skipped k samples leaves the batches after it straddling two results (one copy each)
        until a later task, planned k samples longer, brings them back in step; what each batch holds does not
        depend on it (the good samples in order, cut every ``batch_size``)."""
        plan = _ChunkPlan(batch_size)
        cut = _BatchCut(batch_size, normalization=self.decoder.normalization)
        for decoded in self.chunks(plan.chunks(raw), epoch=epoch, counter=counter):
            plan.skipped(len(decoded.skipped))
            yield from cut.add(decoded)
        if keep_last:
            yield from cut.rest()

    def close(self) -> None:
        self.pool.close()
        self.indexer.close()


class _ChunkPlan:
    """Chunks of raw samples, each ``batch_size`` plus the skipped samples not yet made up for: a chunk decodes to a
    whole batch, and after a skip a later chunk restores the step (see :meth:`SampleDecodePool.batches`)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size, self.short = batch_size, 0

    def skipped(self, count: int) -> None:
        self.short += count

    def chunks(self, items: Iterable) -> Iterator[list]:
        items = iter(items)
        while True:
            size, self.short = self.batch_size + self.short, 0
            chunk = list(itertools.islice(items, size))
            if not chunk:
                return
            yield chunk


class _BatchCut:
    """Decoded chunks -> batches of exactly ``size`` good samples in order: a chunk of exactly ``size`` with nothing
    left over before it is the batch as it is; otherwise the parts are joined."""

    def __init__(self, size: int, *, normalization: tuple | None) -> None:
        self.size, self.normalization = size, normalization
        self.parts: list[DecodedChunk] = []
        self.held = 0

    def add(self, chunk: DecodedChunk) -> Iterator[ClipBatch]:
        if not chunk.keys:
            return
        self.parts.append(chunk)
        self.held += len(chunk.keys)
        while self.held >= self.size:
            take, need = [], self.size
            while need:
                part = self.parts[0]
                if len(part.keys) <= need:
                    take.append(self.parts.pop(0))
                    need -= len(part.keys)
                else:
                    take.append(part.part(0, need))
                    self.parts[0] = part.part(need, len(part.keys))
                    need = 0
            self.held -= self.size
            yield self._batch(take)

    def rest(self) -> Iterator[ClipBatch]:
        if self.parts:
            parts, self.parts, self.held = self.parts, [], 0
            yield self._batch(parts)

    def _batch(self, parts: list[DecodedChunk]) -> ClipBatch:
        if len(parts) == 1:
            one = parts[0]
            return ClipBatch(images=one.images, texts=one.texts, keys=one.keys, tokens=one.tokens,
                             normalization=self.normalization)
        tokens = None if any(p.tokens is None for p in parts) else torch.cat([p.tokens for p in parts])
        return ClipBatch(images=torch.cat([p.images for p in parts]), texts=[t for p in parts for t in p.texts],
                         keys=[k for p in parts for k in p.keys], tokens=tokens, normalization=self.normalization)


@contextmanager
def decode_pool(pool: SampleDecodePool | None, *, transform: Callable, seed: int | None, uint8: bool,
                workers: int) -> Iterator[SampleDecodePool]:
    """``pool`` (a stage's, kept across epochs; it must draw with ``seed`` and ``uint8``), or a pool of ``workers``
    for this read only, closed when the read ends."""
    if pool is not None:
        if pool.decoder.seed != seed or pool.decoder.uint8 != uint8:
            raise ValueError(f"the decode pool draws with seed {pool.decoder.seed} (uint8 {pool.decoder.uint8}), the "
                             f"read asks for seed {seed} (uint8 {uint8})")
        yield pool
        return
    with SampleDecodePool(SampleDecoder(transform, seed=seed, uint8=uint8), workers=workers) as owned:
        yield owned


def concat_batches(parts: Sequence[ClipBatch]) -> ClipBatch:
    """One batch of the parts in order (a rank's data slots side by side; see ``stream_batches``)."""
    if len(parts) == 1:
        return parts[0]
    if len({p.group for p in parts}) != 1:
        raise ValueError(f"slot batches of one step come from different groups {[p.group for p in parts]}")
    tokens = None if any(p.tokens is None for p in parts) else torch.cat([p.tokens for p in parts])
    return ClipBatch(images=torch.cat([p.images for p in parts]), texts=[t for p in parts for t in p.texts],
                     keys=[k for p in parts for k in p.keys], group=parts[0].group, tokens=tokens,
                     normalization=parts[0].normalization)


def stream_batches(*, urls: Sequence[str], batch_size: int, transform: Callable, counter: SkipCounter, seed: int,
                   epoch: int, slot: int = 0, slots: int = 1, shuffle_buffer: int = 1000,
                   workers: int = 0, uint8: bool = False, pool: SampleDecodePool | None = None) -> Iterator[ClipBatch]:
    """Random batches of one data slot for stage 0 (no pseudo-labels): the slot's shards in a per-epoch order, a
    seeded shuffle buffer, decoding in ``workers`` processes, augmentation drawn per sample key.

    The data is laid out in ``slots`` slots (by default one per process; a process may read several, side by side,
    see ``contrastive.modalities.image_text.steps``): shard i goes to slot i % slots after a shuffle seeded by (seed, epoch) that
    every process computes identically, so slots hold disjoint samples and a global batch is the same whatever the
    number of processes. Slots may hold a few samples more or less; the training loop ends the epoch for all ranks
    when the first one runs dry. uint8: batches of uint8 images with their ``normalization`` (see
    :class:`SampleDecoder`). pool: a stage's decode pool kept across epochs (made with this ``transform``, ``seed``
    and ``uint8``; ``workers`` is then its own); None: one for this read.
    """
    if len(urls) < slots:
        raise DataError(f"{len(urls)} shards cannot be split over {slots} data slots (processes): use at least one "
                        "shard per slot (img2dataset --number_sample_per_shard smaller) or fewer processes")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(urls))
    mine = [urls[i] for i in order[slot::slots]]
    sample_rng = np.random.default_rng([seed, epoch, slot])
    with decode_pool(pool, transform=transform, seed=seed, uint8=uint8, workers=workers) as decoding:
        raw = shuffled(decoding.raw_samples(mine, counter=counter), buffer=shuffle_buffer, rng=sample_rng)
        yield from decoding.batches(raw, epoch=epoch, counter=counter, batch_size=batch_size)


def iter_decoded(*, urls: Sequence[str], transform: Callable, counter: SkipCounter, batch_size: int,
                 workers: int = 0) -> Iterator[ClipBatch]:
    """Every good sample of the shards in order, in batches (the last may be shorter): for exports and eval."""
    with decode_pool(None, transform=transform, seed=None, uint8=False, workers=workers) as decoding:
        yield from decoding.batches(decoding.raw_samples(urls, counter=counter), epoch=0, counter=counter,
                                    batch_size=batch_size, keep_last=True)


# ---------------------------------------------------------------------------------------------------- tar writing
TAR_END = b"\0" * 1024  # two zero blocks end a tar archive


def tar_member(name: str, data: bytes) -> bytes:
    """One ustar member (512-byte header + data padded to 512): tars are concatenations of these + TAR_END, so a
    writer can append members to several files at once without keeping tarfile objects open."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    info.mtime = 0  # identical bytes for identical content
    header = info.tobuf(format=tarfile.USTAR_FORMAT)
    return header + data + b"\0" * (-len(data) % 512)


def sample_members(sample: dict) -> bytes:
    """The tar members of a raw sample (all its non-metadata fields) as bytes."""
    key = sample["__key__"]
    return b"".join(tar_member(f"{key}.{ext}", value if isinstance(value, bytes) else str(value).encode())
                    for ext, value in sample.items() if not ext.startswith("__"))


# ---------------------------------------------------------------------------------------------------- tiny shards
TEXTURE_WORDS = {
    "stripes_0": "horizontally striped", "stripes_45": "diagonally striped", "stripes_90": "vertically striped",
    "stripes_135": "anti-diagonally striped", "checker": "checkered", "dots": "dotted", "noise": "speckled",
    "solid": "plain", "grid": "grid-patterned", "rings": "ringed",
}


def caption_for(*, color: str, shape: str, texture: str) -> str:
    """"a red horizontally striped circle"."""
    return f"a {color} {TEXTURE_WORDS[texture]} {shape.replace('_', ' ')}"


def encode_image(image: np.ndarray, *, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format={"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[fmt],
                                **({"quality": 95} if fmt == "jpg" else {}))
    return buffer.getvalue()


DONE_MARKER = "_done.json"


def write_tiny_shards(*, directory: Path, num_samples: int, samples_per_shard: int, image_size: int = 32,
                      num_colors: int = 4, num_shapes: int = 4, num_textures: int = 4, seed: int = 0,
                      corrupt: bool = True, image_format: str = "jpg", key_prefix: str = "") -> dict:
    """Write img2dataset-style shards of procedurally drawn Trifeature images with captions.

    Each sample is ``<key>.jpg`` + ``<key>.txt`` ("a red horizontally striped circle") + ``<key>.json`` (the three
    attributes); each shard ``<n>.tar`` gets an img2dataset-style ``<n>_stats.json``. With ``corrupt`` the second
    sample of the first shard is a truncated JPEG and the fourth has no caption (both counted as successes in the
    stats, as img2dataset would: they break only when decoded). Idempotent: an existing finished directory
    (``_done.json``) is reused. Returns {"pattern", "urls", "num_samples", "corrupt_keys", "dir"}.
    """
    from contrastive.modalities.image.datasets.trifeature import COLOR_NAMES, SHAPE_NAMES, TEXTURE_NAMES, generate_trifeature

    directory = Path(directory)
    if (directory / DONE_MARKER).is_file():
        return json.loads((directory / DONE_MARKER).read_text())
    if num_samples < 1 or samples_per_shard < 1:
        raise ConfigError(f"tiny shards need num_samples >= 1 and samples_per_shard >= 1 (got {num_samples}, "
                          f"{samples_per_shard})")
    images, labels = generate_trifeature(num_train=num_samples, num_test=0, image_size=image_size,
                                         num_colors=num_colors, num_shapes=num_shapes, num_textures=num_textures,
                                         seed=seed)
    tmp = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    num_shards = -(-num_samples // samples_per_shard)
    corrupt_keys: list[str] = []
    names = []
    for shard in range(num_shards):
        rows = range(shard * samples_per_shard, min(num_samples, (shard + 1) * samples_per_shard))
        payload = bytearray()
        for position, row in enumerate(rows):
            key = f"{key_prefix}{shard:05d}{position:04d}"
            attrs = {"color": COLOR_NAMES[labels["color"][row]], "shape": SHAPE_NAMES[labels["shape"][row]],
                     "texture": TEXTURE_NAMES[labels["texture"][row]]}
            image = encode_image(images[row], fmt=image_format)
            sample: dict[str, Any] = {"__key__": key, image_format: image, "txt": caption_for(**attrs).encode()}
            if corrupt and shard == 0 and position == 1:
                sample[image_format] = image[: len(image) // 2]
                corrupt_keys.append(key)
            if corrupt and shard == 0 and position == 3:
                del sample["txt"]
                corrupt_keys.append(key)
            sample["json"] = json.dumps({"key": key, "status": "success", **attrs}).encode()
            payload += sample_members(sample)
        name = f"{shard:05d}"
        (tmp / f"{name}.tar").write_bytes(bytes(payload) + TAR_END)
        (tmp / f"{name}{STATS_SUFFIX}").write_text(json.dumps(
            {"count": len(rows), "successes": len(rows), "failed_to_download": 0, "failed_to_resize": 0}))
        names.append(name)
    pattern = str(directory / f"{{{names[0]}..{names[-1]}}}.tar") if len(names) > 1 else \
        str(directory / f"{names[0]}.tar")
    record = {"pattern": pattern, "urls": [str(directory / f"{n}.tar") for n in names], "num_samples": num_samples,
              "corrupt_keys": corrupt_keys, "dir": str(directory), "created": time.time()}
    (tmp / DONE_MARKER).write_text(json.dumps(record, indent=2))
    if directory.exists():  # a crashed earlier attempt without the marker
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, directory)
    return record
