"""The text export through the shared export loop: 2 gloo ranks (each a contiguous share of the sentences) write
what one process writes (the same ids in the same order, the same embeddings), which is what the served encoder
(``embed_sentences``) gives, and a bf16 export on the CPU stays close to the fp32 one."""
import numpy as np
import pytest
import torch

from contrastive.embeddings import load_embeddings
from contrastive.engine.distributed import DistInfo
from contrastive.modalities.text.dataset import GeneratorParams, load_text_dataset, prepare_generated_text
from contrastive.modalities.text.encoders import TextEncoderSpec
from contrastive.modalities.text.steps import build_text_method, embed_sentences, export_text_embeddings, \
    load_text_model
from tests.distributed import run_gloo_ranks
from tests.unit.export_checks import assert_bf16_export_close_to_fp32

#: Stored embeddings are float16 (a step of 2^-11 relative: under 5e-4 for these entries, all below 1 in size) and
#: the runs batch and pad different sentences together (float noise): 1e-3 absolute covers both.
ATOL = 1e-3


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """A seeded, untrained tiny SimCSE stage model (saved as a trained stage is) over 60 generated sentences."""
    tmp = tmp_path_factory.mktemp("text_export")
    data_dir = prepare_generated_text(root=tmp / "data", params=GeneratorParams(
        num_train=40, num_test=20, num_sts_pairs=4, num_csts_pairs=2))
    encoder = TextEncoderSpec(dim=16, depth=1, heads=2, max_length=16).to_json()
    method = {"name": "simcse_unsup", "temperature": 0.05, "mlp_head": True}
    vocab = load_text_dataset(data_dir).tokenizer().vocab
    torch.manual_seed(0)
    model, _ = build_text_method(encoder=encoder, method=method, vocab=vocab)
    torch.save({"state_dict": model.state_dict(), "encoder": encoder, "method": method, "vocab": vocab},
               tmp / "model.pt")
    return tmp, str(data_dir), str(tmp / "model.pt")


def _export(data_dir, model_path, out_dir, *, precision="fp32", info=None) -> dict:
    return export_text_embeddings(dataset_dir=data_dir, model_path=model_path, out_dir=out_dir, batch_size=7,
                                  device="cpu", precision=precision, info=info)


def _export_rank(rank: int, data_dir: str, model_path: str, out_dir: str) -> None:
    _export(data_dir, model_path, out_dir, info=DistInfo(rank=rank, world_size=2))


def test_two_ranks_export_what_one_process_exports(stage):
    tmp, data_dir, model_path = stage
    one = _export(data_dir, model_path, tmp / "one")
    run_gloo_ranks(_export_rank, data_dir, model_path, str(tmp / "two"))
    dataset = load_text_dataset(data_dir)
    ids_one, z_one = load_embeddings(directory=tmp / "one")
    ids_two, z_two = load_embeddings(directory=tmp / "two")
    assert one["num_samples"] == len(dataset) == 60 and one["dim"] == 16
    assert ids_two.tolist() == ids_one.tolist() == dataset.ids.tolist()
    np.testing.assert_allclose(z_two, z_one, rtol=0, atol=ATOL)
    assert sorted(p.name for p in (tmp / "two").glob("*part-*.npy")) == ["rank000-part-00000.npy",
                                                                         "rank001-part-00000.npy"]
    model, tokenizer, spec = load_text_model(model_path=model_path, device=torch.device("cpu"))
    served = embed_sentences(model=model, tokenizer=tokenizer, sentences=list(dataset.sentences),
                             max_length=spec.max_length, device=torch.device("cpu"))
    np.testing.assert_allclose(z_one, served, rtol=0, atol=ATOL)


def test_bf16_export_on_cpu_is_close_to_fp32(stage):
    """bf16 keeps 8 bits of mantissa: tolerance 0.02 per entry (entries below 1 in size) and cosine >= 0.999 to the
    fp32 embedding (measured on this tiny encoder, 25 Nov 2026: max 0.005, cosine 0.99999)."""
    tmp, data_dir, model_path = stage
    _export(data_dir, model_path, tmp / "fp32")
    _export(data_dir, model_path, tmp / "bf16", precision="bf16")
    assert_bf16_export_close_to_fp32(tmp / "fp32", tmp / "bf16")
