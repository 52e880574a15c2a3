"""The text MCL flow end to end under Prefect's test harness: SimCSE stage 0 + one MCL stage on generated
sentences, the control, MLflow runs with the isotropy trajectory, and a rerun that reuses every step."""
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from contrastive.modalities.text import steps as stages
from flows.pipeline import mcl_pipeline as text_pipeline
from pipeline_config.loader import load_config
from tests.flows.mlflow_runs import artifact_paths, run_tree


@pytest.mark.slow  # about 50 s on an idle 2-core machine, plus the Prefect server's start
def test_text_pipeline_end_to_end(tmp_path, monkeypatch):
    calls = []
    real = stages.train_text_stage

    def counted(spec, **kwargs):
        calls.append((Path(spec.stage_dir).name.split("-")[1], spec.pseudo_labels_path is not None))
        return real(spec, **kwargs)

    monkeypatch.setattr(stages, "train_text_stage", counted)
    config = load_config("text_tiny", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                       f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "hyper.enabled=true",
                                       "hyper.epochs=2"])
    summary = text_pipeline(config)
    results = summary["results"]
    assert set(results) == {"stage 0", "stage 1", "MCL concat", "control concat"}
    attributes = {"subject", "action", "place", "sentiment", "tense"}
    hyper = summary["final"]
    assert {"csts/hyper_spearman", "csts/linear_spearman", "recall/place_hyper"} <= set(hyper)
    for metrics in results.values():
        assert {f"probe/{a}" for a in attributes} <= set(metrics)
        assert -1.0 <= metrics["sts/spearman"] <= 1.0 and "iso/sentence_anisotropy" in metrics
    # stage 0 (random batches), stage 1 on cluster-pure batches, the control's stage 1 on random batches
    assert sorted(calls) == [("train0", False), ("train1", False), ("train1", True)]
    assert "STS Spearman" in (Path(summary["dir"]) / "results.md").read_text()

    client = MlflowClient(tracking_uri=config.tracking.uri)
    parents, children = run_tree(config.tracking.uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    stage1 = next(c for c in children if c.data.tags["kind"] == "mcl" and c.data.tags["stage"] == "1")
    history = client.get_metric_history(stage1.info.run_id, "iso/token_anisotropy")
    assert len(history) >= 1
    files = artifact_paths(client, stage1.info.run_id)
    assert {"eval/isotropy.png", "eval/isotropy.json", "model/model.pt", "clusters/assignments.npz"} <= files
    trajectory = json.loads(Path(client.download_artifacts(stage1.info.run_id, "eval/isotropy.json",
                                                           str(tmp_path / "dl"))).read_text())["history"]
    assert trajectory[0]["step"] == 0 and trajectory[-1]["step"] > 0  # measured at init and while training

    calls.clear()
    again = text_pipeline(config)
    assert calls == [] and again["results"] == results and again["final"] == hyper  # every step reused



@pytest.mark.slow  # two torchrun launches of 2 processes each
def test_text_stage_trains_and_exports_as_two_processes(tmp_path):
    """distributed.nproc_per_node=2: the text stage trains under DDP and its export runs as the same 2 processes
    (torchrun), each rank writing its share; the flow reads back what rank 0 wrote."""
    config = load_config("text_tiny", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                       f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "mcl.num_stages=1",
                                       "distributed.nproc_per_node=2", "distributed.backend=gloo"])
    summary = text_pipeline(config)
    assert {"probe/subject", "sts/spearman"} <= set(summary["results"]["stage 0"])
    steps = Path(config.output_dir) / "steps"
    [train] = [json.loads(p.read_text()) for p in steps.glob("text-train0-*/train_summary.json")]
    assert train["world_size"] == 2 and train["per_rank_batch"] == 16
    [export_dir] = [p.parent for p in steps.glob("text-export0-*/embeddings/export_summary.json")]
    assert json.loads((export_dir / "export_summary.json").read_text())["world_size"] == 2
    assert sorted(p.name for p in export_dir.glob("rank*-part-*.npy")) == ["rank000-part-00000.npy",
                                                                          "rank001-part-00000.npy"]
    assert (export_dir.parent / "torchrun.log").exists()  # the export's own torchrun launch


@pytest.mark.slow  # two runs of the tiny text pipeline with Hyper-CL
def test_rerun_from_recomputes_the_hyper_cl_step_on_the_retrained_stage(tmp_path, monkeypatch):
    """``--rerun-from 1`` where only stage 1's floats change (its key stays): the Hyper-CL step on the final
    representation is computed again from the new weights, not found cached with the old scores."""
    import dataclasses

    rerun = {"on": False}
    real = stages.train_text_stage

    def other_floats(spec, **kwargs):  # the same content key, other weights
        return real(dataclasses.replace(spec, seed=spec.seed + 7) if rerun["on"] else spec, **kwargs)

    monkeypatch.setattr(stages, "train_text_stage", other_floats)
    config = load_config("text_tiny", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                       f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "hyper.enabled=true",
                                       "hyper.epochs=2", "mcl.control=false"])
    first = text_pipeline(config)
    rerun["on"] = True
    again = text_pipeline(config, rerun_from=1)
    steps = Path(config.output_dir) / "steps"
    assert len(list(steps.glob("text-hyper-*.replaced-*"))) == 1  # computed again, the old one kept beside it
    assert again["results"]["stage 0"] == first["results"]["stage 0"]
    assert again["results"]["stage 1"] != first["results"]["stage 1"]
    assert again["final"] != first["final"]
