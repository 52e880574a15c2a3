"""The embedding export: streamed shard by shard, one process or each rank its share (gloo), the same ids and
embeddings either way; unreadable images keep their place with a zero embedding."""
import numpy as np
import pytest

from contrastive.modalities.image import steps as stages
from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
from contrastive.modalities.image.datasets.trifeature import prepare_trifeature
from contrastive import embeddings
from contrastive.embeddings import load_embeddings
from contrastive.engine.distributed import DistInfo
from tests.distributed import run_gloo_ranks
from tests.faults.train_tiny_stage import tiny_spec


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    dataset_dir = prepare_trifeature(root=tmp / "data", num_train=64, num_test=16, image_size=16, num_colors=2,
                                     num_shapes=2, num_textures=2, seed=0)
    summary = stages.train_stage(tiny_spec(dataset_dir, tmp / "stage", epochs=1))
    return tmp, dataset_dir, summary["model_path"]


def _export_rank(rank: int, dataset_dir: str, model_path: str, out_dir: str) -> None:
    stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=model_path, out_dir=out_dir, batch_size=8,
                                   device="cpu", info=DistInfo(rank=rank, world_size=2))


def test_two_ranks_export_what_one_process_exports(trained):
    tmp, dataset_dir, model_path = trained
    one = stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=model_path, out_dir=tmp / "one",
                                         batch_size=8, device="cpu")
    assert one["num_samples"] == 80 and one["unreadable"] == 0
    run_gloo_ranks(_export_rank, str(dataset_dir), model_path, str(tmp / "two"))
    ids_one, z_one = load_embeddings(directory=tmp / "one")
    ids_two, z_two = load_embeddings(directory=tmp / "two")
    assert ids_two.tolist() == ids_one.tolist() == stages.load_dataset(dataset_dir).ids.tolist()
    assert np.allclose(z_one, z_two, atol=1e-3)
    assert sorted(p.name for p in (tmp / "two").glob("*part-*.npy")) == ["rank000-part-00000.npy",
                                                                         "rank001-part-00000.npy"]


def test_channels_last_exports_the_same_embeddings(trained, monkeypatch):
    """The stage's memory format (train.channels_last) changes the speed of the export, not what it writes; with it
    set, every convolution of the export sees its input and its weights in channels_last (without, in NCHW)."""
    import torch
    tmp, dataset_dir, model_path = trained
    real_load = stages.load_trained_model
    formats: list[tuple[bool, bool]] = []  # (input, weight) channels_last, for every convolution's call

    def load_watched(**kwargs):
        model = real_load(**kwargs)
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d):
                module.register_forward_pre_hook(lambda conv, args: formats.append(
                    (args[0].is_contiguous(memory_format=torch.channels_last),
                     conv.weight.is_contiguous(memory_format=torch.channels_last))))
        return model
    monkeypatch.setattr(stages, "load_trained_model", load_watched)
    for name, channels_last in (("contiguous", False), ("channels-last", True)):
        formats.clear()
        stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=model_path, out_dir=tmp / name,
                                       batch_size=8, device="cpu", channels_last=channels_last)
        assert formats and set(formats) == {(channels_last, channels_last)}, (name, set(formats))
    ids_a, z_a = load_embeddings(directory=tmp / "contiguous")
    ids_b, z_b = load_embeddings(directory=tmp / "channels-last")
    assert ids_a.tolist() == ids_b.tolist() and np.abs(z_a).max() > 0
    assert np.allclose(z_a, z_b, atol=2e-3)


def test_shards_stream_at_the_shard_size(trained, monkeypatch):
    tmp, dataset_dir, model_path = trained
    monkeypatch.setattr(embeddings, "SHARD_ROWS", 30)
    stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=model_path, out_dir=tmp / "small",
                                   batch_size=8, device="cpu")
    shards = sorted((tmp / "small").glob("part-*.npy"))
    assert [len(np.load(p)) for p in shards] == [30, 30, 20]
    ids, _ = load_embeddings(directory=tmp / "small")
    assert len(ids) == 80


def test_an_unreadable_image_keeps_its_place_with_a_zero_embedding(trained, tmp_path):
    from PIL import Image
    _, _, model_path = trained
    source = tmp_path / "images"
    for label in ("a", "b"):
        (source / label).mkdir(parents=True)
        for i in range(6):
            Image.new("RGB", (20, 20), (40 * i, 100, 50)).save(source / label / f"{i}.png")
    (source / "a" / "3.png").write_bytes(b"not a png")
    dataset_dir = prepare_image_folder(source=source, root=tmp_path / "prepared", image_size=16, storage="files",
                                       max_skip_fraction=0.5)
    out = stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=model_path, out_dir=tmp_path / "emb",
                                         batch_size=4, device="cpu")
    ids, z = load_embeddings(directory=tmp_path / "emb")
    assert out["unreadable"] == 1 and len(ids) == 12
    broken = ids.tolist().index("a/3.png")
    assert np.all(z[broken] == 0) and np.count_nonzero(np.abs(z).sum(axis=1) == 0) == 1
