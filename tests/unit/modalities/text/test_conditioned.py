"""Hyper-CL as the pipeline's final step, on a tiny trained stage and generated C-STS pairs."""
import json

import pytest

from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.errors import ConfigError
from contrastive.modalities.text.conditioned import run_hyper_cl
from contrastive.modalities.text.dataset import GeneratorParams, prepare_generated_text
from contrastive.modalities.text.encoders import TextEncoderSpec
from contrastive.modalities.text.hyper import HyperSpec
from contrastive.modalities.text.steps import TextStageSpec, train_text_stage


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("hyper")
    data = prepare_generated_text(root=root, params=GeneratorParams(num_train=64, num_test=64, num_sts_pairs=10,
                                                                     num_csts_pairs=60))
    spec = TextStageSpec(stage_dir=str(root / "s0"), seed=0, device="cpu", optim=OptimSpec(lr=1e-3),
                         loop=LoopSpec(epochs=1), dataset_dir=str(data), pseudo_labels_path=None,
                         encoder=TextEncoderSpec(dim=16, depth=1, heads=2, max_length=16).to_json(),
                         method={"name": "simcse_unsup", "temperature": 0.05, "mlp_head": True}, batch_size=16,
                         remainder_policy="partial", threads=1)
    return data, train_text_stage(spec)["model_path"]


def _run(data, model, out, conditions):
    return run_hyper_cl(dataset_dir=data, model_paths=[model, model], out_dir=out,
                        spec=HyperSpec(rank=4, batch_size=16), conditions=conditions, test_fraction=0.3,
                        score_range=(1.0, 5.0), optim=OptimSpec(lr=1e-2), loop=LoopSpec(epochs=3),
                        recall_k=3, device="cpu")


def test_hyper_cl_step_scores_conditioned_pairs(tmp_path, trained):
    data, model = trained
    metrics = _run(data, model, tmp_path / "h", "onehot")
    assert metrics["csts/test_quadruples"] == 18 and metrics["csts/train_quadruples"] == 42
    # The unconditioned cosine is the same under both conditions of a pair: no correlation with the labels.
    assert metrics["csts/unconditioned_spearman"] == pytest.approx(0.0, abs=1e-9)
    for attribute in ("subject", "action", "place", "sentiment", "tense"):
        assert 0.0 <= metrics[f"recall/{attribute}_hyper"] <= 1.0
    assert metrics["csts/reencode_over_project_time"] > 1.0  # a matrix product beats re-encoding
    assert json.loads((tmp_path / "h" / "metrics.json").read_text()) == metrics


def test_tiny_vocabulary_cannot_embed_condition_words(tmp_path, trained):
    data, model = trained
    with pytest.raises(ConfigError, match="hyper.conditions=onehot"):
        _run(data, model, tmp_path / "e", "encoder")
