"""The text modality on the engine: cluster-pure batches, resumption, the isotropy trajectory, export and
evaluation of a tiny SimCSE stage on generated sentences."""
import numpy as np
import pytest
import torch

from contrastive.embeddings import load_embeddings
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.modalities.text.dataset import GeneratorParams, load_text_dataset, prepare_generated_text
from contrastive.modalities.text.encoders import TextEncoderSpec
from contrastive.modalities.text.steps import (TextStageSpec, evaluate_text_embeddings, export_text_embeddings,
                                               train_text_stage)
from tests.unit.engine.recording import Recorder



@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_generated_text(root=tmp_path_factory.mktemp("text"), params=GeneratorParams(
        num_train=96, num_test=48, num_sts_pairs=40, num_csts_pairs=10))


def _spec(stage_dir, data_dir, *, method="simcse_unsup", pseudo=None, epochs=2, every=2):
    return TextStageSpec(stage_dir=str(stage_dir), seed=3, device="cpu", optim=OptimSpec(lr=1e-3),
                         loop=LoopSpec(epochs=epochs, log_every_steps=1, checkpoint_every_steps=1000),
                         dataset_dir=str(data_dir), pseudo_labels_path=pseudo,
                         encoder=TextEncoderSpec(dim=16, depth=1, heads=2, max_length=16).to_json(),
                         method={"name": method, "temperature": 0.05, "mlp_head": True}, batch_size=16,
                         remainder_policy="partial",
                         isotropy={"every_steps": every, "num_sentences": 32, "num_frequent": 5})



def test_mcl_stage_batches_are_cluster_pure(tmp_path, data_dir):
    dataset = load_text_dataset(data_dir)
    train = dataset.indices("train")
    groups = dataset.labels["sentiment"][train]
    np.savez(tmp_path / "pseudo.npz", ids=dataset.ids[train], groups=groups)
    recorder = Recorder()
    summary = train_text_stage(_spec(tmp_path / "s1", data_dir, pseudo=str(tmp_path / "pseudo.npz"), epochs=1),
                               callbacks=[recorder])
    assert summary["cluster_pure_batches"] and recorder.rows
    for rows in recorder.rows:
        assert len(set(groups[rows].tolist())) == 1


def test_supervised_stage_resumes_to_the_same_weights(tmp_path, data_dir):
    full = train_text_stage(_spec(tmp_path / "full", data_dir, method="simcse_sup", every=0))
    train_text_stage(_spec(tmp_path / "killed", data_dir, method="simcse_sup", every=0), stop_after_steps=5)
    resumed = train_text_stage(_spec(tmp_path / "killed", data_dir, method="simcse_sup", every=0))
    assert resumed["resumed_from_step"] == 5 and resumed["steps"] == full["steps"]
    a = torch.load(full["model_path"], weights_only=True)["state_dict"]
    b = torch.load(resumed["model_path"], weights_only=True)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)


def test_stage_tracks_isotropy_then_exports_and_evaluates(tmp_path, data_dir):
    summary = train_text_stage(_spec(tmp_path / "s0", data_dir, epochs=2, every=4))
    steps = [h["step"] for h in __import__("json").loads(
        (tmp_path / "s0" / "isotropy.json").read_text())["history"]]
    assert steps[0] == 0 and steps[-1] == summary["steps"] and len(steps) >= 3
    assert summary["isotropy_start"]["sentence_anisotropy"] != summary["isotropy_end"]["sentence_anisotropy"]
    exported = export_text_embeddings(dataset_dir=data_dir, model_path=summary["model_path"],
                                      out_dir=tmp_path / "emb", batch_size=64, device="cpu")
    ids, embeddings = load_embeddings(directory=tmp_path / "emb")
    dataset = load_text_dataset(data_dir)
    np.testing.assert_array_equal(ids, dataset.ids)
    assert embeddings.shape == (len(dataset), 16) == (exported["num_samples"], exported["dim"])
    one = evaluate_text_embeddings(dataset_dir=data_dir, embeddings_dirs=[tmp_path / "emb"],
                                   model_paths=[summary["model_path"]], probe_c=1.0, probe_max_iter=100,
                                   probe_max_train=1000, knn_k=5, seed=0, device="cpu")
    assert {f"probe/{a}" for a in dataset.attributes} <= set(one)
    assert -1.0 <= one["sts/spearman"] <= 1.0
    two = evaluate_text_embeddings(dataset_dir=data_dir, embeddings_dirs=[tmp_path / "emb"] * 2,
                                   model_paths=[summary["model_path"]] * 2, probe_c=1.0, probe_max_iter=100,
                                   probe_max_train=1000, knn_k=5, seed=0, device="cpu")
    # Concatenating a stage with itself is the same representation up to scale: the same STS ranking.
    assert two["sts/spearman"] == pytest.approx(one["sts/spearman"], abs=1e-6)
