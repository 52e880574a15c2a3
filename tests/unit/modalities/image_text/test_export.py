"""The CLIP export through the shared export loop: 2 gloo ranks (each a contiguous share of the shards) write what
one process writes (the same keys in the same order, the same embeddings, the skip counts summed), and a bf16
export on the CPU stays close to the fp32 one."""
import json

import numpy as np
import pytest

from contrastive.embeddings import load_embeddings
from contrastive.engine.distributed import DistInfo
from contrastive.modalities.image_text.data import write_tiny_shards
from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip, save_stage_model
from contrastive.modalities.image_text.steps import export_stage
from tests.distributed import run_gloo_ranks
from tests.unit.export_checks import assert_bf16_export_close_to_fp32

#: Stored embeddings are float16 (a step of 2^-11 relative, under 5e-4 for these unit vectors), and the two runs
#: batch different rows together (float noise): 1e-3 absolute covers both and nothing more.
RANKS_ATOL = 1e-3


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """An untrained tiny CLIP stage model (the export does not care whether it trained) and 5 tiny shards, one
    truncated JPEG among them."""
    tmp = tmp_path_factory.mktemp("clip_export")
    shards = write_tiny_shards(directory=tmp / "shards", num_samples=40, samples_per_shard=8, seed=1)
    bundle = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=0, trainable_image_blocks=1), device="cpu")
    model_path = save_stage_model(model=bundle.model, spec=bundle.spec, path=tmp / "model.pt",
                                  weights_file=bundle.weights_file)
    return tmp, shards, str(model_path)


def _export(urls, model_path, out_dir, *, precision="fp32", info=None) -> dict:
    return export_stage(model_path=model_path, urls=urls, out_dir=str(out_dir), batch_size=6, device="cpu",
                        max_skip_fraction=0.2, precision=precision, info=info)


def _export_rank(rank: int, urls: list[str], model_path: str, out_dir: str) -> None:
    _export(urls, model_path, out_dir, info=DistInfo(rank=rank, world_size=2))


def test_two_ranks_export_what_one_process_exports(stage):
    tmp, shards, model_path = stage
    one = _export(shards["urls"], model_path, tmp / "one")
    run_gloo_ranks(_export_rank, shards["urls"], model_path, str(tmp / "two"))
    ids_one, z_one = load_embeddings(directory=tmp / "one")
    ids_two, z_two = load_embeddings(directory=tmp / "two")
    assert len(ids_one) == one["num_samples"] == 40 - len(shards["corrupt_keys"])
    assert ids_two.tolist() == ids_one.tolist()
    assert not set(shards["corrupt_keys"]) & set(ids_one.tolist())
    np.testing.assert_allclose(z_two, z_one, rtol=0, atol=RANKS_ATOL)
    assert sorted(p.name for p in (tmp / "two").glob("*part-*.npy")) == ["rank000-part-00000.npy",
                                                                         "rank001-part-00000.npy"]
    two = json.loads((tmp / "two" / "export_summary.json").read_text())  # what the launcher reads back
    assert two["world_size"] == 2 and two["num_samples"] == one["num_samples"]
    assert {k: two["data"][k] for k in ("good", "skipped", "seen")} == \
        {k: one["data"][k] for k in ("good", "skipped", "seen")}
    assert two["data"]["skipped"] >= 1  # the truncated JPEG, counted on the rank that read it


def test_bf16_export_on_cpu_is_close_to_fp32(stage):
    """bf16 keeps 8 bits of mantissa: tolerance 0.02 per entry of a unit vector and cosine >= 0.999 to the fp32
    embedding (measured on this tiny ViT, 25 Nov 2026: max 0.005, cosine 0.9999)."""
    tmp, shards, model_path = stage
    _export(shards["urls"][:2], model_path, tmp / "fp32")
    _export(shards["urls"][:2], model_path, tmp / "bf16", precision="bf16")
    assert_bf16_export_close_to_fp32(tmp / "fp32", tmp / "bf16")
