"""Image-text shards: URL patterns, sample counts, tolerant decoding with counted skips, the tiny-shard writer."""
import json
import tarfile

import pytest
import torch

from contrastive.data.urls import expand_urls, to_webdataset_url
from contrastive.modalities.image_text.data import (SampleDecodePool, SampleDecoder, SkipCounter, count_samples,
                                                    iter_decoded, iter_raw_samples, stream_batches, tar_member,
                                                    write_tiny_shards)
from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip
from contrastive.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_tiny_shards(directory=tmp_path_factory.mktemp("shards") / "train", num_samples=40,
                             samples_per_shard=10, seed=3)


@pytest.fixture(scope="module")
def transform():
    return create_clip(spec=ClipSpec(model_name=TINY_MODEL, trainable_image_blocks=1)).eval_transform


def test_writer_makes_img2dataset_style_shards(shards):
    urls = expand_urls(shards["pattern"])
    assert urls == shards["urls"] and len(urls) == 4
    first = sorted(tarfile.open(urls[0]).getnames())[:3]
    assert first == ["000000000.jpg", "000000000.json", "000000000.txt"]
    stats = json.loads(open(urls[0].replace(".tar", "_stats.json")).read())
    assert stats["successes"] == 10
    assert shards["corrupt_keys"] == ["000000001", "000000003"]
    # Idempotent: a finished directory is reused as is.
    again = write_tiny_shards(directory=urls[0].rsplit("/", 1)[0], num_samples=40, samples_per_shard=10, seed=3)
    assert again["urls"] == shards["urls"]


def test_url_patterns_and_sample_counts(shards, tmp_path):
    urls = expand_urls(shards["urls"][0] + "::" + shards["pattern"])
    assert len(urls) == 5
    assert count_samples(shards["urls"]).total == 40 and count_samples(shards["urls"]).source == "*_stats.json"
    assert count_samples(shards["urls"], num_samples=7).total == 7
    sizes_dir = tmp_path / "sized"
    sizes_dir.mkdir()
    for name in ("a.tar", "b.tar"):
        (sizes_dir / name).write_bytes(b"")
    (sizes_dir / "sizes.json").write_text(json.dumps({"a.tar": 3, "b.tar": 4}))
    assert count_samples(expand_urls(str(sizes_dir / "{a,b}.tar"))).total == 7
    with pytest.raises(DataError, match="set data.num_samples"):
        count_samples(["https://example.invalid/00000.tar"])
    with pytest.raises(DataError, match="img2dataset"):
        expand_urls(str(tmp_path / "{00000..00002}.tar"))
    with pytest.raises(ConfigError, match="data.shards"):
        expand_urls("")
    assert to_webdataset_url("s3://bucket/x.tar") == "pipe:aws s3 cp s3://bucket/x.tar -"


def test_broken_samples_are_skipped_counted_and_bounded(shards, transform):
    counter = SkipCounter(max_skip_fraction=0.1)
    batches = list(iter_decoded(urls=shards["urls"], transform=transform, counter=counter, batch_size=16))
    keys = [k for b in batches for k in b.keys]
    assert len(keys) == 38 and not set(shards["corrupt_keys"]) & set(keys)
    assert counter.stats()["skipped_bad_image"] == 1 and counter.stats()["skipped_no_caption"] == 1
    assert batches[0].images.shape == (16, 3, 32, 32)
    assert all(t.startswith("a ") for b in batches for t in b.texts)
    strict = SkipCounter(max_skip_fraction=0.01)
    list(iter_decoded(urls=shards["urls"], transform=transform, counter=strict, batch_size=16))
    with pytest.raises(DataError, match="2 of 40 samples are broken.*data.max_skip_fraction"):
        strict.check()


def test_pipe_urls_and_tar_members_read_back(shards, tmp_path):
    piped = list(iter_raw_samples([f"pipe:cat {shards['urls'][1]}"]))
    assert len(piped) == 10 and piped[0]["__key__"] == "000010000"
    path = tmp_path / "one.tar"
    path.write_bytes(tar_member("k1.txt", b"hello") + tar_member("k1.jpg", b"\xff" * 700) + b"\0" * 1024)
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["k1.txt", "k1.jpg"] and tar.extractfile("k1.txt").read() == b"hello"


def test_stage0_stream_splits_shards_across_slots(shards, transform):
    seen = []
    for rank in range(2):
        counter = SkipCounter(max_skip_fraction=0.1)
        batches = list(stream_batches(urls=shards["urls"], batch_size=4, transform=transform, counter=counter, seed=0,
                                      epoch=0, slot=rank, slots=2, shuffle_buffer=8))
        assert all(len(b) == 4 for b in batches)
        seen.append({k for b in batches for k in b.keys})
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) >= 38 - 2 * 3  # each rank drops at most its last partial batch
    with pytest.raises(DataError, match="one shard per slot"):
        next(stream_batches(urls=shards["urls"][:1], batch_size=4, transform=transform,
                            counter=SkipCounter(max_skip_fraction=0.1), seed=0, epoch=0, slot=0, slots=2))


def test_the_decode_pool_keeps_order_counts_skips_here_and_keeps_its_workers(shards):
    """Two worker processes decode the same samples as the calling thread, in order, with the same keyed crops; the
    skipped samples are counted in the caller's counter; the workers serve a second read and end on close."""
    from torchvision import transforms as T
    transform = T.Compose([T.RandomResizedCrop(16, scale=(0.3, 1.0)), T.ToTensor()])
    raw = list(iter_raw_samples(shards["urls"]))
    inline_counter, pooled_counter = SkipCounter(max_skip_fraction=0.1), SkipCounter(max_skip_fraction=0.1)
    with SampleDecodePool(SampleDecoder(transform, seed=5), workers=0) as inline:
        expected = list(inline.batches(raw, epoch=1, counter=inline_counter, batch_size=8, keep_last=True))
    pool = SampleDecodePool(SampleDecoder(transform, seed=5), workers=2)
    tasks = []
    pool.chunks = lambda chunks, **kw: SampleDecodePool.chunks(pool, (tasks.append(len(c)) or c for c in chunks), **kw)
    got = list(pool.batches(raw, epoch=1, counter=pooled_counter, batch_size=8, keep_last=True))
    assert tasks[:4] == [8] * 4 and sum(tasks) == len(raw)  # a batch a task, any workers
    workers = pool.pool.worker_processes()
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    assert [b.keys for b in got] == [b.keys for b in expected] and sum(map(len, got)) == 38
    assert all(torch.equal(a.images, b.images) for a, b in zip(got, expected))
    assert pooled_counter.stats() == inline_counter.stats() and pooled_counter.stats()["skipped_bad_image"] == 1
    again = list(pool.batches(raw[:10], epoch=2, counter=pooled_counter, batch_size=8))
    assert pool.pool.worker_processes() == workers and again[0].keys == expected[0].keys
    assert not torch.equal(again[0].images, got[0].images)  # epoch 2 draws other crops
    pool.close()
    for worker in workers:
        worker.join(timeout=10)
    assert not any(w.is_alive() for w in workers)


def test_a_task_that_skipped_samples_is_made_up_for_and_whole_batches_are_not_copied():
    """Batches are the good samples in order, cut every batch_size; a chunk that is exactly a batch is that batch
    (its tensor, not a copy); after a skip the next planned chunk is longer by the samples skipped."""
    from contrastive.modalities.image_text.data import DecodedChunk, _BatchCut, _ChunkPlan

    def chunk(first: int, n: int) -> DecodedChunk:
        return DecodedChunk(keys=[str(k) for k in range(first, first + n)], texts=["t"] * n,
                            images=torch.arange(first, first + n).view(n, 1), skipped=[])
    cut = _BatchCut(4, normalization=None)
    chunks = [chunk(0, 3), chunk(3, 4), chunk(7, 5), chunk(12, 4)]  # the first skipped one, the third made up
    batches = [b for c in chunks for b in cut.add(c)]
    assert [b.keys for b in batches] == [[str(k) for k in range(i, i + 4)] for i in range(0, 16, 4)]
    assert batches[-1].images is chunks[-1].images and not any(b.images is c.images for b in batches[:3]
                                                                for c in chunks)
    plan = _ChunkPlan(4)
    planned = plan.chunks(range(20))
    assert len(next(planned)) == 4
    plan.skipped(2)
    assert [len(next(planned)), len(next(planned))] == [6, 4]


def test_the_reading_process_parses_no_tar_and_hands_the_workers_batches_over_as_they_are(transform, tmp_path,
                                                                                        monkeypatch):
    """With decode workers, the shards' members are indexed by a worker and read by the decoders: the reading
    process opens no tar (tarfile.open here is broken) and reads the same batches as without workers; a batch is
    the worker's result in shared memory (no copy here)."""
    shards = write_tiny_shards(directory=tmp_path / "clean", num_samples=40, samples_per_shard=10, corrupt=False)
    expected = list(stream_batches(urls=shards["urls"], batch_size=8, transform=transform, uint8=True, seed=2,
                                   epoch=1, shuffle_buffer=16, counter=SkipCounter(max_skip_fraction=0.1)))
    monkeypatch.setattr(tarfile, "open", lambda *a, **k: (_ for _ in ()).throw(AssertionError("tar read here")))
    with SampleDecodePool(SampleDecoder(transform, seed=2, uint8=True), workers=1) as pool:
        got = list(stream_batches(urls=shards["urls"], batch_size=8, transform=transform, uint8=True, seed=2,
                                  epoch=1, shuffle_buffer=16, counter=SkipCounter(max_skip_fraction=0.1), pool=pool))
    assert [b.keys for b in got] == [b.keys for b in expected] and len(got) == 5
    assert all(torch.equal(a.images, b.images) and a.images.is_shared() for a, b in zip(got, expected))


def test_a_shard_index_is_webdataset_s_reading_with_the_bytes_left_in_the_file(shards, tmp_path):
    """index_shard gives iter_raw_samples' samples (an incomplete shard cut the same way, its tar error counted),
    the members of a local tar as (offset, size), which read back as the same bytes."""
    from contrastive.modalities.image_text.data import _with_member_bytes, index_shard
    data = open(shards["urls"][1], "rb").read()
    member = tarfile.open(shards["urls"][1]).getmembers()[15]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: member.offset_data + member.size // 2])
    for url in (str(cut), shards["urls"][2], f"pipe:cat {shards['urls'][2]}"):
        counter = SkipCounter(max_skip_fraction=1.0)
        expected = list(iter_raw_samples([url], counter=counter))
        index = index_shard(url)
        files: dict = {}
        assert [_with_member_bytes(s, files) for s in index.samples] == expected
        assert len(index.skipped) == counter.stats().get("skipped_tar_error", 0)
    assert isinstance(index_shard(str(cut)).samples[0]["jpg"], tuple) and len(index_shard(str(cut)).skipped) >= 1


def test_an_incomplete_shard_is_read_up_to_the_cut_and_counted(shards, tmp_path):
    data = open(shards["urls"][1], "rb").read()
    member = tarfile.open(shards["urls"][1]).getmembers()[15]  # the 6th sample's first member
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: member.offset_data + member.size // 2])  # an interrupted download
    counter = SkipCounter(max_skip_fraction=1.0)
    samples = list(iter_raw_samples([str(cut), shards["urls"][2]], counter=counter))
    assert len([s for s in samples if s["__key__"].startswith("00001")]) == 5
    assert len([s for s in samples if s["__key__"].startswith("00002")]) == 10  # reading goes on
    assert counter.stats()["skipped_tar_error"] >= 1


def test_decode_workers_tokenise_and_the_reading_thread_then_does_not(shards, transform):
    """With a tokenizer the decode workers tokenise each chunk's good captions; the batch reaches the step with
    the tokens the reading thread would have made, and ready_for_step does not tokenise again."""
    from contrastive.modalities.image_text.data import ready_for_step
    tokenizer = create_clip(spec=ClipSpec(model_name=TINY_MODEL, trainable_image_blocks=1)).tokenizer
    counter = SkipCounter(max_skip_fraction=0.1)
    with SampleDecodePool(SampleDecoder(transform, seed=1, uint8=True, tokenizer=tokenizer), workers=1) as pool:
        batch = next(stream_batches(urls=shards["urls"], batch_size=8, transform=transform, counter=counter, seed=1,
                                    epoch=0, uint8=True, pool=pool))
    assert batch.tokens is not None and torch.equal(batch.tokens, tokenizer(batch.texts))
    ready = ready_for_step(batch, tokenizer=lambda texts: (_ for _ in ()).throw(AssertionError("tokenised again")),
                           pin_memory=False)
    assert torch.equal(ready.tokens, tokenizer(batch.texts))


def test_a_stage_pool_must_draw_as_the_read_asks(shards, transform):
    """A pool made for another seed or image type would give other augmentations than the read names: refused."""
    from contrastive.modalities.image_text.data import decode_pool
    with SampleDecodePool(SampleDecoder(transform, seed=1, uint8=True), workers=0) as pool:
        with decode_pool(pool, transform=transform, seed=1, uint8=True, workers=3) as same:
            assert same is pool and same.workers == 0
        for seed, uint8 in ((2, True), (1, False)):
            with pytest.raises(ValueError, match="the decode pool draws with seed 1"):
                with decode_pool(pool, transform=transform, seed=seed, uint8=uint8, workers=0):
                    pass
