"""The CLIP MCL flow end to end on CPU under Prefect's test harness: 2 stages of the tiny open_clip model on tiny
shards (one truncated image, one sample without caption), the MLflow run tree, artifacts, and caching on rerun."""
import json
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from contrastive.modalities.image_text import steps as stages
from flows.pipeline import mcl_pipeline as clip_pipeline
from pipeline_config.loader import load_config
from tests.flows.mlflow_runs import artifact_paths, run_tree


@pytest.fixture
def clip_config(tmp_path):
    return load_config("clip_tiny", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                     f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "device=cpu",
                                     "train.max_steps_per_epoch=4", "data.synthetic.num_train=288"])


@pytest.fixture
def count_training(monkeypatch):
    calls: list[str] = []
    real = stages.train_stage

    def wrapped(spec, **kwargs):
        calls.append(Path(spec.stage_dir).name.split("-")[1])
        return real(spec, **kwargs)

    monkeypatch.setattr(stages, "train_stage", wrapped)
    return calls


def test_clip_mcl_pipeline_run_tree_artifacts_and_cache(clip_config, count_training):
    config = clip_config
    summary = clip_pipeline(config)
    assert set(summary["results"]) == {"stage 0", "stage 1", "MCL concat", "soup"}
    for metrics in summary["results"].values():
        assert 0.0 <= metrics["mmvp/average"] <= 100.0 and metrics["count/mmvp_pairs"] == 18
        assert {"mmvp/orientation_and_direction", "retrieval/i2t_r@1", "retrieval/t2i_r@10"} <= set(metrics)
    assert count_training == ["train0", "train1"]
    assert summary["dir"] and "mlflow ui" in summary["tracking_hint"]

    client = MlflowClient(tracking_uri=config.tracking.uri)
    parents, children = run_tree(config.tracking.uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    for run in [parent, *children]:
        assert run.data.tags["pipeline_id"] == config.config_hash() == run.data.tags["config_hash"]
        assert run.data.tags["prefect.flow_run_id"]
    assert sorted(c.data.tags["stage"] for c in children) == ["0", "1"]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert {"config.yaml", "eval/mmvp.png", "eval/retrieval.png", "eval/summary.json",
            "eval/mcl_concat/metrics.json", "eval/soup/metrics.json", "combined/model/model.pt"} <= \
        artifact_paths(client, parent.info.run_id)
    stage0, stage1 = sorted(children, key=lambda r: r.data.tags["stage"])
    files0, files1 = artifact_paths(client, stage0.info.run_id), artifact_paths(client, stage1.info.run_id)
    for expected in ("checkpoints/last.pt", "model/model.pt", "embeddings/manifest.json", "embeddings/ids.npy",
                     "eval/stage0/metrics.json"):
        assert expected in files0, expected
    # what stage 1 trained on (the k-means of stage 0, its pseudo-labels and their re-shard) is in stage 1's run
    assert {"checkpoints/last.pt", "model/model.pt", "embeddings/ids.npy", "eval/stage1/metrics.json",
            "clusters/assignments.npz", "clusters/summary.json", "pseudo_labels/pseudo_labels.npz",
            "regrouped/grouped.json"} <= files1
    assert not any(f.startswith(("clusters/", "pseudo_labels/", "regrouped/")) for f in files0)
    # The broken samples were skipped and counted; they have no embedding and no pseudo-label.
    assert stage0.data.metrics["export/skipped_bad_image"] == 1
    assert stage0.data.metrics["export/skipped_no_caption"] == 1
    assert stage1.data.metrics["batch_plan/cluster_pure"] == 1 and stage0.data.metrics["batch_plan/cluster_pure"] == 0
    assert stage1.data.params["model.name"] == "mclpipe-tiny-vit" and stage1.data.tags["cluster_pure_batches"] == "True"
    steps = Path(config.output_dir) / "steps"
    pseudo = np.load(next(steps.glob("pseudo1-*")) / "pseudo_labels.npz")
    assert pseudo["ids"].size == 286 and not {"000000001", "000000003"} & set(pseudo["ids"].tolist())
    grouped = json.loads((next(steps.glob("clip-grouped1-*")) / "grouped" / "grouped.json").read_text())
    assert grouped["samples"] == 286 and grouped["unlabelled_skipped"] == 2

    # The same pipeline again: nothing is retrained, no empty stage run is opened, and the rerun points at the
    # runs that hold the stages.
    count_training.clear()
    again = clip_pipeline(config)
    assert count_training == []
    assert again["results"] == summary["results"]
    parents, children = run_tree(config.tracking.uri)
    assert len(parents) == 2 and len(children) == 2
    assert {r["run_id"] for r in again["stage_runs"].values()} == {c.info.run_id for c in children}


@pytest.mark.slow
def test_on_a_cluster_launcher_the_eval_sets_are_encoded_by_a_job_with_the_same_scores(clip_config, tmp_path):
    """launcher.kind=torchrun (the launcher interface, as Slurm and Kubernetes use it): each model's MMVP and
    retrieval sets are encoded by a one-process job (its log beside the step, not on the flow's node), and the
    scores equal those of the in-process encoding."""
    local = clip_pipeline(clip_config.model_copy(update={"mcl": clip_config.mcl.model_copy(update={"num_stages": 1})}))
    config = load_config("clip_tiny", [f"output_dir={tmp_path / 'runs-job'}", f"data.cache_dir={tmp_path / 'data'}",
                                       f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "device=cpu",
                                       "train.max_steps_per_epoch=4", "data.synthetic.num_train=288",
                                       "mcl.num_stages=1", "launcher.kind=torchrun"])
    remote = clip_pipeline(config)
    encode_logs = list(Path(config.output_dir).rglob("encode_summary_job.log"))
    assert encode_logs and len(encode_logs) == len(list(Path(config.output_dir).glob("steps/clip-encode-*")))
    for log in encode_logs:
        encoded = json.loads((log.parent / "encode_summary.json").read_text())["path"]
        assert encoded == "eval_features.npz", encoded  # relative to its step directory: the run directory may move
        args = json.loads((log.parent / "encode_summary_args.json").read_text())
        assert args["entry"].endswith(":encode_eval_sets_from_json")
    assert remote["results"].keys() == local["results"].keys()
    for name, metrics in local["results"].items():
        for metric, value in metrics.items():
            if metric.startswith(("mmvp/", "retrieval/")):
                assert remote["results"][name][metric] == pytest.approx(value, abs=1e-6), (name, metric)


@pytest.mark.slow  # two pipeline runs of the tiny CLIP model (about 90 s on an idle 2-core machine)
def test_rerun_from_recomputes_the_encodings_soup_and_scores_of_a_retrained_stage(clip_config, monkeypatch):
    """``--rerun-from 1`` where only the floats change (the keys stay: as a GPU's nondeterminism, or a setting
    outside the content key, gives): stage 1 retrains, and its encoding, the soup, the soup's encoding and every
    score that reads stage 1 are computed again from the new weights, never found cached; stage 0's stay."""
    import dataclasses

    rerun = {"on": False}
    real = stages.train_stage

    def other_floats(spec, **kwargs):  # the same content key, other weights
        return real(dataclasses.replace(spec, seed=spec.seed + 7) if rerun["on"] else spec, **kwargs)

    monkeypatch.setattr(stages, "train_stage", other_floats)
    first = clip_pipeline(clip_config)
    table = (Path(first["dir"]) / "results.md").read_text()
    rerun["on"] = True
    again = clip_pipeline(clip_config, rerun_from=1)
    steps = Path(clip_config.output_dir) / "steps"
    replaced = sorted(d.name.split("-")[1] for d in steps.glob("*.replaced-*"))
    # stage 1's re-shard, training, export, encoding and score, the soup, its encoding and score, and the MCL
    # concat's score
    assert replaced == ["encode", "encode", "eval", "eval", "eval", "export1", "grouped1", "soup", "train1"], replaced
    assert again["results"]["stage 0"] == first["results"]["stage 0"]
    for row in ("stage 1", "soup", "MCL concat"):
        assert again["results"][row] != first["results"][row], row
    assert (Path(again["dir"]) / "results.md").read_text() != table
