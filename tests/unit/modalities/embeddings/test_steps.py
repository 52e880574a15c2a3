"""The embeddings modality on the engine: cluster-pure batches, exact resume, two views drawn from the task's
own generator, export keyed by id and evaluation of one stage and a concatenation."""
import numpy as np
import pytest
import torch

from contrastive.embeddings import load_embeddings
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.modalities.embeddings.adapter import FeatureBatch, FeatureSimCLR, FeatureViewTask
from contrastive.modalities.embeddings.data import load_feature_dataset, prepare_synthetic
from contrastive.modalities.embeddings.steps import (FeatureStageSpec, embed_features, evaluate_feature_embeddings,
                                                     export_feature_embeddings, load_feature_model,
                                                     train_feature_stage)
from contrastive.methods.losses import nt_xent
from tests.unit.engine.recording import Recorder



@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_synthetic(root=tmp_path_factory.mktemp("features"), num_train=128, num_test=64, dim=12,
                             classes={"dominant": 4, "weak": 2}, scales={"dominant": 3.0, "weak": 1.0}, noise=0.3,
                             seed=0)


def _spec(stage_dir, data_dir, *, pseudo=None, epochs=2):
    return FeatureStageSpec(stage_dir=str(stage_dir), seed=5, device="cpu", optim=OptimSpec(lr=3e-3),
                            loop=LoopSpec(epochs=epochs, log_every_steps=1, checkpoint_every_steps=1000),
                            dataset_dir=str(data_dir), pseudo_labels_path=pseudo,
                            encoder={"hidden": 16, "depth": 1, "dim": 4, "projection_dim": 8},
                            views={"temperature": 0.2, "feature_dropout": 0.2, "noise": 0.1}, batch_size=16,
                            remainder_policy="partial")



def test_mcl_stage_batches_are_cluster_pure(tmp_path, data_dir):
    dataset = load_feature_dataset(data_dir)
    train = dataset.indices("train")
    groups = dataset.labels["dominant"][train]
    np.savez(tmp_path / "pseudo.npz", ids=dataset.ids[train], groups=groups)
    recorder = Recorder()
    summary = train_feature_stage(_spec(tmp_path / "s1", data_dir, pseudo=str(tmp_path / "pseudo.npz"), epochs=1),
                                  callbacks=[recorder])
    assert summary["cluster_pure_batches"] and len(recorder.rows) == summary["steps"] > 0
    for rows in recorder.rows:
        assert len(set(groups[rows].tolist())) == 1


def test_a_stopped_stage_resumes_to_the_same_weights(tmp_path, data_dir):
    full = train_feature_stage(_spec(tmp_path / "full", data_dir))
    train_feature_stage(_spec(tmp_path / "killed", data_dir), stop_after_steps=5)
    resumed = train_feature_stage(_spec(tmp_path / "killed", data_dir))
    assert resumed["resumed_from_step"] == 5 and resumed["steps"] == full["steps"] == 16
    a = torch.load(full["model_path"], weights_only=True)["state_dict"]
    b = torch.load(resumed["model_path"], weights_only=True)["state_dict"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)


def test_views_drop_and_perturb_features_from_the_task_generator():
    """Without noise a view is the input with each feature kept (scaled by 1 / (1 - p)) or zeroed; the loss is
    NT-Xent of the two projected views; the same seed draws the same views."""
    model = FeatureSimCLR(in_dim=50, hidden=8, depth=1, dim=4, projection_dim=4, temperature=0.5)
    features = torch.ones(20, 50)
    task = FeatureViewTask(model=model, feature_std=np.ones(50), feature_dropout=0.5, noise=0.0, seed=3)
    inputs = task.inputs(FeatureBatch(rows=np.arange(20), ids=np.arange(20), features=features),
                         device=torch.device("cpu"), step=0)
    values = torch.unique(inputs["view1"])
    assert set(values.tolist()) == {0.0, 2.0} and not torch.equal(inputs["view1"], inputs["view2"])
    again = FeatureViewTask(model=model, feature_std=np.ones(50), feature_dropout=0.5, noise=0.0, seed=3)
    torch.testing.assert_close(again.view(features), inputs["view1"])
    model.eval()
    loss, _ = model(**inputs)
    z1, z2 = model.projector(model.encoder(inputs["view1"])), model.projector(model.encoder(inputs["view2"]))
    torch.testing.assert_close(loss, nt_xent(z1=z1, z2=z2, temperature=0.5))


def test_export_keeps_every_id_and_evaluation_scores_stages(tmp_path, data_dir):
    dataset = load_feature_dataset(data_dir)
    summaries = [train_feature_stage(_spec(tmp_path / f"s{j}", data_dir, epochs=1)) for j in range(2)]
    dirs = []
    for j, summary in enumerate(summaries):
        result = export_feature_embeddings(dataset_dir=str(data_dir), model_path=summary["model_path"],
                                           out_dir=str(tmp_path / f"e{j}"), batch_size=50, device="cpu")
        assert result["num_samples"] == len(dataset) and result["dim"] == 4
        dirs.append(result["dir"])
    ids, embeddings = load_embeddings(directory=tmp_path / "e0")
    assert ids.tolist() == dataset.ids.tolist()
    model = load_feature_model(model_path=summaries[0]["model_path"], device=torch.device("cpu"))
    direct = embed_features(model, dataset.features[:7], device=torch.device("cpu"))
    np.testing.assert_allclose(embeddings[:7], direct, atol=2e-3, rtol=2e-3)  # the export stores float16
    one = evaluate_feature_embeddings(dataset_dir=str(data_dir), embeddings_dirs=dirs[:1], probe_c=1.0,
                                      probe_max_iter=100, probe_max_train=1000, knn_k=5, seed=0)
    both = evaluate_feature_embeddings(dataset_dir=str(data_dir), embeddings_dirs=dirs, probe_c=1.0,
                                       probe_max_iter=100, probe_max_train=1000, knn_k=5, seed=0)
    assert set(one) == set(both) == {"probe/dominant", "probe/weak", "knn/dominant", "knn/weak"}
    assert one["probe/dominant"] > 0.5  # 4 classes: chance is 0.25
    with pytest.raises(ValueError, match=r"expected \(n, 12\) features"):
        embed_features(model, np.zeros((3, 5)), device=torch.device("cpu"))
