"""The one export loop (contrastive/embeddings.py): rows kept in place, the stage's precision, inference mode, one
device -> host read per batch one batch late, pinned staging of the inputs in two sets, and the rank-ordered
manifest of a split export."""
import itertools
import json

import numpy as np
import pytest
import torch

from contrastive import embeddings
from contrastive.embeddings import (EmbeddingWriter, ExportBatch, HostToDevice, compute_embeddings, export_ranked,
                                    load_embeddings, rank_share)
from contrastive.engine.distributed import DistInfo

CPU = torch.device("cpu")


class Rows:
    """An in-memory writer: the float32 blocks and ids compute_embeddings hands over."""

    def __init__(self):
        self.blocks, self.ids, self.dim = [], [], 0

    def add(self, block, ids):
        self.blocks.append(block)
        self.ids.append(ids)


def test_missing_rows_keep_their_place_with_zeros():
    weight = torch.randn(3, 4)
    batches = [ExportBatch(ids=np.array([10, 11, 12]), inputs=(torch.ones(2, 3),),
                           present=np.array([True, False, True])),
               ExportBatch(ids=np.array([13]), inputs=(torch.full((1, 3), 2.0),))]
    rows = Rows()
    missing = compute_embeddings(encode=lambda x: x @ weight, batches=batches, device=CPU, writer=rows)
    assert missing == 1 and [i.tolist() for i in rows.ids] == [[10, 11, 12], [13]]
    expected = (torch.ones(3) @ weight).numpy()
    np.testing.assert_allclose(rows.blocks[0], [expected, np.zeros(4), expected], rtol=1e-6)
    np.testing.assert_allclose(rows.blocks[1][0], 2 * expected, rtol=1e-6)


@pytest.mark.parametrize("precision, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_encoder_runs_under_the_precision_and_inference_mode(precision, dtype):
    seen = []

    def encode(x):
        out = torch.nn.functional.linear(x, torch.ones(2, 3))  # autocast casts a linear layer's inputs
        seen.append((out.dtype, torch.is_inference_mode_enabled()))
        return out

    rows = Rows()
    compute_embeddings(encode=encode, batches=[ExportBatch(ids=np.arange(2), inputs=(torch.ones(2, 3),))],
                       device=CPU, writer=rows, precision=precision)
    assert seen == [(dtype, True)] and rows.blocks[0].dtype == np.float32


class OnDevice(torch.Tensor):
    """A CPU tensor standing for one on the GPU: what is computed from it stays OnDevice, and reaching the host (a
    copy to the CPU, or a read of its values) is recorded in ``reads`` as (how, non_blocking) and returns a plain
    tensor (the host copy)."""
    reads: list = []
    HOST_READS = {torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__,
                  torch.Tensor.__float__, torch.Tensor.__int__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_host = func is torch.Tensor.to and torch.device(args[1] if len(args) > 1 else kwargs["device"]).type == "cpu"
        if func not in cls.HOST_READS and not to_host:
            return super().__torch_function__(func, types, args, kwargs)
        cls.reads.append((func.__name__, bool(kwargs.get("non_blocking"))))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
            return out.as_subclass(torch.Tensor) if isinstance(out, torch.Tensor) else out


class FakeEvent:
    """torch.cuda.Event, recording when it is recorded and waited for into ``log``. Each has a serial number of its
    own: ``id()`` of a collected event is reused by the next one, which made five events look like three."""
    log: list = []
    made = itertools.count()

    def __init__(self, *args, **kwargs):
        self.serial = next(self.made)

    def record(self):
        self.log.append(("record", self.serial))

    def synchronize(self):
        self.log.append(("synchronize", self.serial))


@pytest.fixture
def cuda_path(monkeypatch):
    """compute_embeddings' CUDA path run on the CPU: the device check says CUDA, pinned buffers are plain ones and
    events are FakeEvents."""
    FakeEvent.log = []
    monkeypatch.setattr(embeddings, "pinned_copies", lambda device: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(HostToDevice, "_allocate",
                        staticmethod(lambda numel, *, dtype: FakeEvent.log.append("pinned") or torch.empty(numel,
                                                                                                        dtype=dtype)))
    return FakeEvent.log


@pytest.mark.parametrize("path", ["cpu", "cuda"])
def test_one_device_to_host_read_per_batch(path, request):
    """The encoder's output (standing for a GPU tensor) reaches the host once per batch: ``.cpu()`` on the CPU, one
    non-blocking copy on CUDA, whose values are read only after the batch's event has been waited for; the CUDA
    path stages the inputs through pinned buffers. The rows arrive unchanged, in order."""
    log = request.getfixturevalue("cuda_path") if path == "cuda" else []
    OnDevice.reads = []

    class Logged(Rows):
        def add(self, block, ids):
            log.append(("write", int(ids[0])))
            super().add(block, ids)

    def encode(x):
        log.append(("encode", int(x[0, 0])))
        return (x * 2).as_subclass(OnDevice)
    batches = [ExportBatch(ids=np.arange(4) + 4 * b, inputs=(torch.full((4, 3), float(4 * b)),)) for b in range(5)]
    rows = Logged()
    compute_embeddings(encode=encode, batches=batches, device=CPU, writer=rows)
    assert OnDevice.reads == [("cpu", False) if path == "cpu" else ("to", True)] * 5
    assert [type(b) for b in rows.blocks] == [np.ndarray] * 5
    assert [float(b[0, 0]) for b in rows.blocks] == [8.0 * b for b in range(5)]
    if path == "cuda":
        events = [entry[1] for entry in log if entry[0] == "record"]
        assert len(set(events)) == 5 and log.count("pinned") == 2  # one buffer per set of the two, reused
        # batch b: its inputs staged, its forward, its event recorded; its values read once its event has passed,
        # after batch b + 1's forward was queued
        steps = [entry for entry in log if entry != "pinned"]
        for b in range(5):
            assert steps.index(("synchronize", events[b])) + 1 == steps.index(("write", 4 * b))
            assert steps.index(("record", events[b])) == steps.index(("encode", 4 * b)) + 1
            if b < 4:
                assert steps.index(("encode", 4 * (b + 1))) < steps.index(("synchronize", events[b]))


def test_inputs_are_staged_through_two_sets_of_reused_pinned_buffers(monkeypatch):
    """The CUDA path's staging, run on the CPU with an unpinned buffer in place of a pinned one: batches use two
    sets of buffers in turn (batch i + 1 is staged while batch i's copy may still read its buffer), each input its
    own buffer in a set, reused while batches fit it, grown when one does not; the values arrive unchanged."""
    allocated = []

    def allocate(numel, *, dtype):
        allocated.append((numel, dtype))
        return torch.empty(numel, dtype=dtype)

    monkeypatch.setattr(HostToDevice, "_allocate", staticmethod(allocate))
    stager = HostToDevice(CPU)
    previous = None
    for shape in [(4, 3), (2, 3), (3, 3), (6, 3)]:
        images, mask = torch.randn(shape), torch.ones(shape[0], dtype=torch.int64)
        staged = stager.staged((images, mask))
        assert torch.equal(staged[0], images) and torch.equal(staged[1], mask)
        if previous is not None:  # staging this batch left the previous batch's staged inputs as they were
            assert torch.equal(previous[0][0], previous[1][0]) and torch.equal(previous[0][1], previous[1][1])
        previous = (staged, tuple(t.clone() for t in staged))
    # set 0: batches 1 and 3 (the (3, 3) batch fits the first's buffers); set 1: batches 2 and 4 (grown for (6, 3))
    assert allocated == [(12, torch.float32), (4, torch.int64), (6, torch.float32), (2, torch.int64),
                         (18, torch.float32), (6, torch.int64)]
    assert stager((torch.ones(2),))[0].device == CPU  # off CUDA: a plain copy, nothing pinned


def test_each_batch_is_written_after_the_next_batch_is_queued():
    """The read-back of batch i waits for the GPU: it comes after batch i + 1's forward is queued, so the GPU is
    never idle while the host writes; the rows still arrive in order, the last batch included."""
    events = []

    class Recording(Rows):
        def add(self, block, ids):
            events.append(("write", int(ids[0])))
            super().add(block, ids)

    def encode(x):
        events.append(("encode", int(x[0, 0])))
        return x * 2
    batches = [ExportBatch(ids=np.array([b]), inputs=(torch.full((1, 3), float(b)),)) for b in range(3)]
    rows = Recording()
    compute_embeddings(encode=encode, batches=batches, device=CPU, writer=rows)
    assert events == [("encode", 0), ("encode", 1), ("write", 0), ("encode", 2), ("write", 1), ("write", 2)]
    assert [float(b[0, 0]) for b in rows.blocks] == [0.0, 2.0, 4.0]


def test_ranks_write_their_shares_and_rank_0_the_manifest_in_rank_order(tmp_path):
    """Without a process group the barrier is a no-op, so the ranks of a 3-rank export can run one after the
    other here (rank 0 last: it reads the others' parts). 5 ids over 3 ranks: 2, 2, 1; one rank may hold none."""
    ids = np.array(["a", "b", "c", "d", "e"])
    vectors = np.arange(10, dtype=np.float32).reshape(5, 2)

    def run(world: int, out):
        summaries = {}
        for rank in reversed(range(world)):
            info = DistInfo(rank=rank, world_size=world)
            mine = rank_share(len(ids), info=info)

            def embed(writer: EmbeddingWriter):
                writer.add(vectors[mine], ids[mine])
                return {"unreadable": int(rank == 1)}
            summaries[rank] = export_ranked(out_dir=out, info=info, embed=embed,
                                            summarize=lambda counts: {"seen_by_summarize": counts["unreadable"]})
        return summaries

    one, three, six = run(1, tmp_path / "one"), run(3, tmp_path / "three"), run(6, tmp_path / "six")
    assert [len(rank_share(5, info=DistInfo(rank=r, world_size=3))) for r in range(3)] == [2, 2, 1]
    for out in ("one", "three", "six"):
        got_ids, got = load_embeddings(directory=tmp_path / out)
        assert got_ids.tolist() == ids.tolist()
        np.testing.assert_array_equal(got, vectors)
    assert one[0]["world_size"] == 1 and one[0]["unreadable"] == 0
    assert three[1] == three[2] == {} and three[0]["unreadable"] == 1 == three[0]["seen_by_summarize"]
    manifest = json.loads((tmp_path / "three" / embeddings.MANIFEST).read_text())
    assert manifest["shards"] == ["rank000-part-00000.npy", "rank001-part-00000.npy", "rank002-part-00000.npy"]
    assert json.loads((tmp_path / "six" / "export_summary.json").read_text())["num_samples"] == 5


def test_string_ids_are_held_compact_and_written_as_u_of_the_longest(tmp_path):
    """The writer holds string ids as StringDType (a <U batch costs 4 B a character of its longest id, each), and
    ids.npy holds them as <U of the longest one, loadable without pickle; integer ids stay integers."""
    ids = np.array(["a", "é/ü-longer-than-fifteen-characters", "c"] * 4)
    writer = EmbeddingWriter(tmp_path / "strings", shard_size=5)
    for start in range(0, 12, 4):
        writer.add(np.ones((4, 3), np.float32), ids[start:start + 4])
    assert all(held.dtype == np.dtypes.StringDType() for held in writer.ids)
    embeddings.write_manifest(directory=tmp_path / "strings", parts=[writer.finish()])
    saved = np.load(tmp_path / "strings" / "ids.npy", allow_pickle=False)
    assert saved.dtype == ids.dtype == np.dtype("<U34") and saved.tolist() == ids.tolist()

    numbered = EmbeddingWriter(tmp_path / "numbers")
    numbered.add(np.ones((3, 2), np.float32), np.arange(3))
    embeddings.write_manifest(directory=tmp_path / "numbers", parts=[numbered.finish()])
    assert np.load(tmp_path / "numbers" / "ids.npy").dtype == np.int64


# ---------------------------------------------------------------------------------------------------- the writer
def shard_files(directory):
    return sorted(p.name for p in directory.iterdir())


def test_shards_stream_to_disk_across_shard_boundaries_and_the_short_last_one_says_its_rows(tmp_path):
    rows = np.random.default_rng(0).standard_normal((13, 6)).astype(np.float32)
    writer = EmbeddingWriter(tmp_path, shard_size=5)
    for start in range(0, 13, 3):  # blocks of 3 cross the shard ends at 5 and 10
        writer.add(rows[start:start + 3], np.arange(start, min(start + 3, 13)))
    part = writer.finish()
    assert part["shards"] == ["part-00000.npy", "part-00001.npy", "part-00002.npy"] and part["dim"] == 6
    assert shard_files(tmp_path) == part["shards"]  # no temporary file left
    loaded = [np.load(tmp_path / name, allow_pickle=False) for name in part["shards"]]
    assert [s.shape for s in loaded] == [(5, 6), (5, 6), (3, 6)] and all(s.dtype == np.float16 for s in loaded)
    np.testing.assert_array_equal(np.concatenate(loaded), rows.astype(np.float16))
    mapped = np.load(tmp_path / "part-00002.npy", mmap_mode="r")  # the rewritten header of the short shard
    np.testing.assert_array_equal(mapped, rows[10:].astype(np.float16))
    np.testing.assert_array_equal(part["ids"], np.arange(13))


def test_an_export_of_no_rows_writes_one_empty_shard(tmp_path):
    part = EmbeddingWriter(tmp_path).finish()
    assert part["shards"] == ["part-00000.npy"] and part["dim"] == 0
    assert np.load(tmp_path / "part-00000.npy", allow_pickle=False).shape == (0, 0)


def test_the_callers_buffer_may_be_reused_as_soon_as_add_returns(tmp_path):
    buffer = np.ones((4, 3), np.float32)  # compute_embeddings' pinned output buffers are reused batch after batch
    writer = EmbeddingWriter(tmp_path, shard_size=100)
    writer.add(buffer, np.arange(4))
    buffer[:] = 7
    writer.add(buffer, np.arange(4, 8))
    writer.finish()
    np.testing.assert_array_equal(np.load(tmp_path / "part-00000.npy"), np.repeat([1.0, 7.0], 4)[:, None] * np.ones(3))


def test_a_full_disk_while_a_shard_streams_is_the_steps_disk_full_error_and_leaves_no_partial_file(tmp_path,
                                                                                                   monkeypatch):
    import errno

    from contrastive.errors import DiskFullError
    written = []

    def fill_up(self, block):
        written.append(len(block))
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.tmp))
        self.handle.write(memoryview(block).cast("B"))
    monkeypatch.setattr(embeddings._ShardFiles, "_rows", fill_up)
    writer = EmbeddingWriter(tmp_path, shard_size=100)
    with pytest.raises(DiskFullError, match=r"part-00000\.npy"):
        for start in range(0, 40, 4):
            writer.add(np.ones((4, 3), np.float32), np.arange(start, start + 4))
        writer.finish()
    writer.abort()
    assert shard_files(tmp_path) == []


def _wait_for_temporary_shard(directory, *, name="part-00000.npy.tmp", seconds=10.0):
    """The temporary file of the shard in progress, once the writing thread has opened it (it does so a moment
    after ``add`` returns: listing the folder at once would find nothing whether or not the export cleans up)."""
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [p.name for p in directory.iterdir() if p.name.startswith(name)]
        if found:
            return found
        time.sleep(0.01)
    pytest.fail(f"the writing thread never opened {name}: {shard_files(directory)}")


def test_an_export_that_fails_part_way_stops_its_writer_and_removes_the_shard_in_progress(tmp_path):
    writers = []

    def embed(writer):
        writers.append(writer)
        writer.add(np.ones((4, 3), np.float32), np.arange(4))
        assert len(_wait_for_temporary_shard(tmp_path)) == 1  # the shard in progress is on disk when the encoder fails
        raise RuntimeError("the encoder broke")
    with pytest.raises(RuntimeError, match="the encoder broke"):
        export_ranked(out_dir=tmp_path, info=DistInfo(rank=0, world_size=1, local_rank=0), embed=embed)
    assert not writers[0].files.is_alive()  # abort stopped the writing thread
    assert shard_files(tmp_path) == []  # and removed the temporary shard


def test_rows_reach_the_disk_while_the_export_goes_on_not_when_it_finishes(tmp_path):
    """The shard in progress streams into its temporary file as rows arrive (the export's GPU work overlaps the
    disk's), so finish only ends the file: before, its rows were written and fsynced in one go at the end."""
    import time
    writer = EmbeddingWriter(tmp_path, shard_size=1000)
    writer.add(np.ones((3, 8), np.float32), np.arange(3))
    temporary = tmp_path / "part-00000.npy.tmp"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        streamed = [p for p in tmp_path.iterdir() if p.name.startswith(temporary.name)]
        if streamed and streamed[0].stat().st_size == embeddings.NPY_HEADER_BYTES + 3 * 8 * 2:
            break
        time.sleep(0.01)
    else:
        pytest.fail(f"the 3 rows were not streamed to disk before finish: {shard_files(tmp_path)}")
    assert not (tmp_path / "part-00000.npy").exists()  # not under its name until it is complete
    writer.finish()
    assert np.load(tmp_path / "part-00000.npy").shape == (3, 8)


def _export_of(directory, *, rows: int, dim: int, shard_size: int):
    vectors = np.random.default_rng(rows).standard_normal((rows, dim)).astype(np.float16)
    ids = np.array([f"s{i:06d}" for i in range(rows)])
    embeddings.save_embeddings(embeddings=vectors, ids=ids, directory=directory, shard_size=shard_size)
    return ids, vectors.astype(np.float32)


def test_chosen_rows_come_back_in_the_order_asked_across_shards(tmp_path):
    ids, reference = _export_of(tmp_path / "e", rows=23, dim=3, shard_size=5)
    rows = np.array([22, 0, 7, 7, 5, 4, 19])
    np.testing.assert_array_equal(embeddings.load_embedding_rows(directory=tmp_path / "e", rows=rows),
                                  reference[rows])
    got_ids, got = load_embeddings(directory=tmp_path / "e")
    assert got_ids.tolist() == ids.tolist() and got.dtype == np.float32
    np.testing.assert_array_equal(got, reference)
    assert embeddings.load_embedding_rows(directory=tmp_path / "e", rows=np.array([], np.int64)).shape == (0, 3)
    with pytest.raises(IndexError, match="outside the 23 samples"):
        embeddings.load_embedding_rows(directory=tmp_path / "e", rows=np.array([23]))


@pytest.mark.parametrize("rows", [None, "half"])
def test_loading_holds_one_float32_matrix_and_no_float16_copy_beside_it(tmp_path, rows):
    """k-means' RAM is the (M, D) float32 matrix (the plan's closed form): loading it must not hold the float16
    shards concatenated beside it (+50 %) or the whole matrix before the rows are picked (+200 % for half)."""
    import tracemalloc
    _export_of(tmp_path / "e", rows=8_000, dim=256, shard_size=2_048)
    picked = None if rows is None else np.arange(0, 8_000, 2)[::-1].copy()
    matrix = (8_000 if rows is None else 4_000) * 256 * 4
    tracemalloc.start()
    try:
        out = embeddings.load_embedding_rows(directory=tmp_path / "e", rows=picked)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.nbytes == matrix
    assert peak < matrix * 1.25, f"peak {peak:,} B for a {matrix:,} B matrix"


def test_every_row_asked_is_written_not_left_from_a_freed_buffer(tmp_path):
    """numpy hands a freed small buffer of the same size to the next ``np.empty``: a row the loader forgot to write
    would still hold what was there (under mutation testing, the unmutated run's right answer), so NaN is left there
    first."""
    _, reference = _export_of(tmp_path / "e", rows=23, dim=3, shard_size=5)
    rows = np.array([22, 0, 7, 7, 5, 4, 19])
    for picked, shape in ((rows, (7, 3)), (None, (23, 3))):
        poison = np.full(shape, np.nan, dtype=np.float32)
        del poison
        got = embeddings.load_embedding_rows(directory=tmp_path / "e", rows=picked)
        np.testing.assert_array_equal(got, reference if picked is None else reference[picked])


def test_an_export_creates_its_directory_with_parents_and_a_missing_manifest_is_named(tmp_path):
    from contrastive.errors import DataError
    vectors = np.ones((2, 3), np.float16)
    embeddings.save_embeddings(embeddings=vectors, ids=np.array(["a", "b"]), directory=tmp_path / "run" / "s1" / "e")
    np.testing.assert_array_equal(embeddings.load_embedding_rows(directory=tmp_path / "run" / "s1" / "e"), vectors)
    with pytest.raises(DataError) as refused:
        embeddings.load_embedding_rows(directory=tmp_path / "run")
    assert str(refused.value) == (f"no finished embedding export in {tmp_path / 'run'} (manifest.json missing): the "
                                  "export was interrupted or deleted; rerun the pipeline to export again")


# ------------------------------------------------------- what the mutation run of embeddings.py found untested
class Sized(Rows):
    """An in-memory writer that knows its width once a block has come, as EmbeddingWriter does."""

    def add(self, block, ids):
        super().add(block, ids)
        self.dim = block.shape[1]


def test_a_batch_with_no_row_present_is_zeros_of_the_writers_width_and_every_missing_row_counted():
    weight = torch.randn(3, 4)
    batches = [ExportBatch(ids=np.array([0, 1]), inputs=(torch.ones(2, 3),)),
               ExportBatch(ids=np.array([2, 3]), inputs=(torch.ones(0, 3),), present=np.array([False, False])),
               ExportBatch(ids=np.array([4, 5, 6]), inputs=(torch.ones(1, 3),),
                           present=np.array([False, True, False]))]
    rows, progress = Sized(), []
    missing = compute_embeddings(encode=lambda x: x @ weight, batches=batches, device=CPU, writer=rows,
                                 progress=lambda n, dim: progress.append((n, dim)))
    expected = (torch.ones(3) @ weight).numpy()
    assert missing == 2 + 2 and progress == [(2, 4), (2, 4), (3, 4)]
    assert [b.dtype for b in rows.blocks] == [np.float32] * 3 and [i.tolist() for i in rows.ids] == [[0, 1], [2, 3],
                                                                                                       [4, 5, 6]]
    np.testing.assert_array_equal(rows.blocks[1], np.zeros((2, 4), np.float32))
    np.testing.assert_allclose(rows.blocks[2], [np.zeros(4), expected, np.zeros(4)], rtol=1e-6)


def test_a_cuda_export_hands_its_cached_memory_back_and_a_cpu_one_does_not(monkeypatch):
    """Run without a GPU: a CUDA export whose batches have no row present never touches the device."""
    from contrastive.engine import loop
    released = []
    monkeypatch.setattr(loop, "release_device_memory", released.append)
    cuda = torch.device("cuda")
    assert embeddings.pinned_copies(cuda) and not embeddings.pinned_copies(CPU)
    empty = [ExportBatch(ids=np.array([0]), inputs=(torch.ones(0, 3),), present=np.array([False]))]
    compute_embeddings(encode=lambda x: x, batches=empty, device=CPU, writer=Rows())
    assert released == []
    compute_embeddings(encode=lambda x: x, batches=empty, device=cuda, writer=Rows())
    assert released == [cuda]


class CopyLog(torch.Tensor):
    """A tensor whose ``.to`` calls are recorded as (positional arguments, keyword arguments)."""
    calls: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            cls.calls.append((args[1:], kwargs))
        return super().__torch_function__(func, types, args, kwargs)


def test_inputs_are_copied_to_the_device_asked_and_non_blocking_from_pinned_buffers(monkeypatch):
    """The meta device stands for another device than the CPU: a plain ``.to`` off CUDA; on the CUDA path (forced)
    ``.to(device, non_blocking=True)`` of each staged buffer."""
    meta = torch.device("meta")
    assert HostToDevice(meta)((torch.ones(2, 3),))[0].device == meta
    CopyLog.calls = []
    monkeypatch.setattr(embeddings, "pinned_copies", lambda device: True)
    monkeypatch.setattr(HostToDevice, "_allocate",
                        staticmethod(lambda numel, *, dtype: torch.empty(numel, dtype=dtype).as_subclass(CopyLog)))
    out = HostToDevice(meta)((torch.ones(2, 3), torch.zeros(2, dtype=torch.int64)))
    assert [t.device for t in out] == [meta, meta]
    assert CopyLog.calls == [((meta,), {"non_blocking": True})] * 2


def test_the_writing_thread_is_a_named_daemon_and_an_aborted_writer_refuses_more_rows(tmp_path):
    """A daemon: an export that dies without abort does not keep the interpreter alive; after abort, ``add`` says
    so instead of queueing blocks for a thread that is gone (the ninth would wait forever)."""
    writer = EmbeddingWriter(tmp_path)
    assert writer.files.name == "embedding-shards" and writer.files.daemon is True
    writer.abort()  # before any shard was opened: nothing to close or remove
    with pytest.raises(RuntimeError, match="^export aborted$"):
        writer.add(np.ones((1, 3), np.float32), np.arange(1))
    assert shard_files(tmp_path) == []


def test_an_export_failing_just_after_a_full_shard_keeps_that_shard_and_raises_its_own_error(tmp_path):
    def embed(writer):
        import time
        writer.add(np.ones((4, 3), np.float32), np.arange(4))  # exactly one shard: closed, none in progress
        deadline = time.monotonic() + 10
        while not (tmp_path / "part-00000.npy").exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # the writing thread has closed and renamed it: no file is open when abort runs
        raise RuntimeError("the encoder broke")
    with pytest.raises(RuntimeError, match="the encoder broke"):
        export_ranked(out_dir=tmp_path, info=DistInfo(rank=0, world_size=1, local_rank=0), embed=embed, shard_size=4)
    assert shard_files(tmp_path) == ["part-00000.npy"]


def test_an_io_error_that_is_not_a_full_disk_is_raised_as_it_is(tmp_path, monkeypatch):
    import errno

    from contrastive.errors import DiskFullError

    def broken(self, block):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(embeddings._ShardFiles, "_rows", broken)
    writer = EmbeddingWriter(tmp_path)
    writer.add(np.ones((2, 3), np.float32), np.arange(2))
    with pytest.raises(OSError, match="Input/output error") as raised:
        writer.finish()
    assert not isinstance(raised.value, DiskFullError)


def _sync_points(tmp_path, monkeypatch, *, every: int, blocks: list[int]) -> list[int]:
    """The shard's data bytes on disk at each fdatasync, with SYNC_EVERY_BYTES = ``every`` and blocks of that many
    bytes (rows of one float16)."""
    import os
    synced = []
    monkeypatch.setattr(embeddings, "SYNC_EVERY_BYTES", every)
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(os.fstat(fd).st_size - embeddings.NPY_HEADER_BYTES))
    writer = EmbeddingWriter(tmp_path / str(every), shard_size=1000)
    for size in blocks:
        writer.add(np.ones((size // 2, 1), np.float32), np.arange(size // 2))
    writer.finish()
    return synced


def test_a_shard_is_synced_each_time_its_unsynced_bytes_reach_the_limit(tmp_path, monkeypatch):
    assert _sync_points(tmp_path, monkeypatch, every=100, blocks=[50, 50, 50, 50]) == [100, 200]
    assert _sync_points(tmp_path, monkeypatch, every=99, blocks=[98, 2, 96, 2]) == [100]


def test_fortran_ordered_rows_are_written_row_by_row(tmp_path):
    rows = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(4, 3))
    writer = EmbeddingWriter(tmp_path)
    writer.add(rows, np.arange(4))
    writer.finish()
    np.testing.assert_array_equal(np.load(tmp_path / "part-00000.npy"), rows.astype(np.float16))
    with pytest.raises(ValueError, match="^3 embeddings but 2 ids$"):
        writer.add(rows[:3], np.arange(2))


def test_held_ids_are_strings_for_bytes_and_objects_and_an_empty_writer_has_integer_ids(tmp_path):
    for ids in (np.array([b"a", b"bc"]), np.array(["a", "bc"], dtype=object)):
        held = embeddings.held_ids(ids)
        assert held.dtype == np.dtypes.StringDType() and held.tolist() == ["a", "bc"]
    assert EmbeddingWriter(tmp_path).finish()["ids"].dtype == np.int64


def test_the_shard_header_fills_128_bytes_exactly_and_refuses_one_that_does_not_fit():
    import io
    header = embeddings.npy_header(rows=10**30, dim=10**30)  # a dict of 117 characters: no padding left
    assert len(header) == 128 and header.endswith(b")}\n")
    assert np.lib.format.read_array_header_1_0(io.BytesIO(header[8:]))[0] == (10**30, 10**30)
    with pytest.raises(ValueError, match=r"^a \(10+, 10+\) shard's header does not fit 128 bytes$"):
        embeddings.npy_header(rows=10**31, dim=10**30)


def test_an_export_with_a_pickled_or_inconsistent_ids_file_is_refused(tmp_path):
    from contrastive.errors import DataError
    _export_of(tmp_path / "e", rows=3, dim=2, shard_size=5)
    np.save(tmp_path / "e" / "ids.npy", np.array(["a", "b", "c"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        embeddings.load_embedding_ids(directory=tmp_path / "e")
    np.save(tmp_path / "e" / "ids.npy", np.arange(2))
    inconsistent = (f"embedding export in {tmp_path / 'e'} is inconsistent with its manifest: delete the directory "
                    "and rerun the pipeline")
    with pytest.raises(DataError) as refused:
        embeddings.load_embedding_ids(directory=tmp_path / "e")
    assert str(refused.value) == inconsistent
    manifest = json.loads((tmp_path / "e" / embeddings.MANIFEST).read_text())
    (tmp_path / "e" / embeddings.MANIFEST).write_text(json.dumps({**manifest, "num_samples": 4}))
    with pytest.raises(DataError) as refused:
        embeddings.load_embedding_rows(directory=tmp_path / "e")
    assert str(refused.value) == inconsistent


def test_the_manifest_names_every_field_and_no_rows_asked_is_an_empty_list(tmp_path):
    _export_of(tmp_path / "e", rows=3, dim=2, shard_size=5)
    assert json.loads((tmp_path / "e" / embeddings.MANIFEST).read_text()) == {
        "num_samples": 3, "dim": 2, "dtype": "float16", "shards": ["part-00000.npy"], "ids": "ids.npy"}
    assert embeddings.load_embedding_rows(directory=tmp_path / "e", rows=[]).shape == (0, 2)
    empty = {"shards": ["a.npy"], "ids": np.zeros(0, np.int64), "dim": 0}
    manifest = embeddings.write_manifest(directory=tmp_path, parts=[empty, {**empty, "shards": ["b.npy"]}])
    assert manifest["shards"] == ["a.npy"]  # ranks with no samples: one empty shard listed, not one per rank


def test_a_split_export_sums_counts_a_rank_lacks_refuses_pickled_rank_ids_and_passes_its_shard_size(tmp_path):
    vectors = np.arange(12, dtype=np.float32).reshape(6, 2)

    def run(rank, out, counts, before=None):
        info = DistInfo(rank=rank, world_size=2)
        mine = rank_share(6, info=info)

        def embed(writer):
            writer.add(vectors[mine], mine)
            return counts
        if before:
            before()
        return export_ranked(out_dir=out, info=info, embed=embed, shard_size=2)
    run(1, tmp_path / "a", {"skipped": 2})
    summary = run(0, tmp_path / "a", {"unreadable": 1})
    assert summary == {"dir": str(tmp_path / "a"), "num_samples": 6, "dim": 2, "world_size": 2, "skipped": 2,
                       "unreadable": 1}
    assert json.loads((tmp_path / "a" / embeddings.MANIFEST).read_text())["shards"] == [
        f"rank{r:03d}-part-{s:05d}.npy" for r in range(2) for s in range(2)]
    run(1, tmp_path / "b", {})
    pickled = lambda: np.save(tmp_path / "b" / "rank001-ids.npy", np.arange(3).astype(object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        run(0, tmp_path / "b", {}, before=pickled)


def test_a_full_disk_while_writing_the_ids_names_the_embedding_export(tmp_path, monkeypatch):
    import errno

    from contrastive.errors import DiskFullError

    def full(file, array):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(embeddings, "write_npy", full)
    with pytest.raises(DiskFullError, match=r"while writing an embedding export \(ids\.npy\);"):
        embeddings.write_manifest(directory=tmp_path, parts=[{"shards": [], "ids": np.arange(2), "dim": 1}])


def test_save_embeddings_cuts_shards_of_65_536_rows_by_default(tmp_path):
    manifest = embeddings.save_embeddings(embeddings=np.ones((65_537, 1), np.float32), ids=np.arange(65_537),
                                          directory=tmp_path)
    assert manifest["shards"] == ["part-00000.npy", "part-00001.npy"]
