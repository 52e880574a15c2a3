"""Pure helpers of tasks/steps.py (no Prefect run needed)."""
from pipeline_config.schema import ClipPipelineConfig, ImagePipelineConfig
from tasks.steps import stage_seed


def test_stage_seeds_are_distinct_across_pipeline_seeds_and_stages():
    # seed + stage made stage 1 of seed 0 the same model as stage 0 of seed 1 (a control stage has no
    # pseudo-labels), so a 3-seed study silently shared models between seeds.
    seeds = {(seed, stage): stage_seed(ImagePipelineConfig(seed=seed), stage) for seed in range(10) for stage in range(100)}
    assert len(set(seeds.values())) == len(seeds)
    assert stage_seed(ClipPipelineConfig(seed=2), 1) == stage_seed(ImagePipelineConfig(seed=2), 1)


def test_a_retried_flow_run_reopens_its_parent_run_not_a_stage_run(tmp_path):
    """A retried Prefect flow run keeps its id; its stage runs carry that id too. The retry reopened the latest
    run with the id (a stage run) as the pipeline's parent, so the results and the model went into stage 1's run."""
    from tasks.steps import open_pipeline_run, open_stage_run, tracker_for

    config = ImagePipelineConfig(output_dir=str(tmp_path / "runs"),
                            tracking={"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "retry"})
    opened = {"config": config, "pipeline_id": config.config_hash(), "pipeline_dir": str(tmp_path / "p")}
    parent = open_pipeline_run.fn(**opened, flow_run_id="flow-1")
    stages = [open_stage_run.fn(config=config, parent_run_id=parent, stage=stage, kind="mcl",
                                pipeline_id=config.config_hash(), flow_run_id="flow-1") for stage in (0, 1)]
    tracker = tracker_for(config)
    for run_id in (parent, *stages):
        tracker.end_run(run_id, status="FAILED")

    assert open_pipeline_run.fn(**opened, flow_run_id="flow-1") == parent  # the retry
    assert tracker.client.get_run(parent).info.status == "RUNNING"
    assert tracker.client.get_run(stages[1]).info.status == "FAILED"
    assert open_stage_run.fn(config=config, parent_run_id=parent, stage=1, kind="mcl",
                             pipeline_id=config.config_hash(), flow_run_id="flow-1") == stages[1]
    # another flow run of the same config opens a parent of its own
    assert open_pipeline_run.fn(**opened, flow_run_id="flow-2") not in (parent, *stages)


def test_kmeans_runs_on_its_own_gpu_inside_the_steps_concurrency_slot(tmp_path, monkeypatch):
    """The clustering step holds a slot of launcher.concurrency_limit while k-means runs, on one GPU (the first
    this process sees), or on none with device=cpu; never every visible GPU of the flow's process."""
    from contextlib import contextmanager

    import tasks.steps as task_steps
    from tasks.records import ExportRecord

    events = []

    @contextmanager
    def slot(config):
        events.append("slot taken")
        yield
        events.append("slot given back")

    def cluster_stage(**kwargs):
        events.append(("k-means", kwargs["gpu_devices"]))
        return {}
    monkeypatch.setattr(task_steps, "gpu_slot", slot)
    monkeypatch.setattr(task_steps.steps, "cluster_stage", cluster_stage)
    monkeypatch.setattr(task_steps, "tracker_for", lambda config: None)
    monkeypatch.setattr(type(task_steps.modality_of(ImagePipelineConfig())), "sample_scope",
                        lambda self, data: (None, None))
    monkeypatch.setattr(task_steps, "finish_cluster_record", lambda **kwargs: kwargs["summary"])
    exported = ExportRecord(key="e", dir=str(tmp_path), embeddings_dir=str(tmp_path), num_samples=8, dim=4,
                            mlflow_run_id="r")
    for device, devices in (("auto", (0,)), ("cuda", (0,)), ("cpu", ())):
        events.clear()
        config = ImagePipelineConfig(device=device)
        task_steps.cluster_embeddings.fn(config=config, key="k", out_dir=str(tmp_path / device), stage=0,
                                         exported=exported, earlier=[], data={}, mlflow_run_id="r")
        assert events == ["slot taken", ("k-means", devices), "slot given back"]


def test_the_run_that_finishes_a_training_takes_its_key_from_a_killed_attempts_run(tmp_path):
    """A training begun in one run and killed (its run tagged with the train_key, a loss curve, no final loss), then
    finished in another (a pipeline sharing the step computed it in its own run): the training must have one run
    tagged with its key, the one holding the final loss (tests/e2e/test_load.py found the killed one)."""
    import json

    from tasks.steps import finish_train_record, tracker_for

    config = ImagePipelineConfig(output_dir=str(tmp_path / "runs"),
                                 tracking={"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "keys"})
    tracker = tracker_for(config)
    killed = tracker.start_run(name="mcl-stage1", tags={"train_key": "k1"})
    tracker.log_metrics(killed, {"train/loss": 2.0}, step=2)
    finished_elsewhere = tracker.start_run(name="mcl-stage1", tags={"train_key": "k2"})
    tracker.log_metrics(finished_elsewhere, {"train/final_loss": 1.0})
    unfinished_other = tracker.start_run(name="mcl-stage1", tags={"train_key": "k2"})  # another key: not touched
    done = tracker.start_run(name="mcl-stage1", tags={"train_key": "k1"})
    stage_dir = tmp_path / "steps" / "train1-k1"
    for sub in ("checkpoints", "model"):
        (stage_dir / sub).mkdir(parents=True)
        (stage_dir / sub / "file.pt").write_bytes(b"weights")
    summary = {"steps": 8, "final_loss": 1.5, "resumed_from_step": None, "seconds": 3.0, "batch_plan": {"groups": 3},
               "model_path": str(stage_dir / "model" / "file.pt")}
    (stage_dir / "train_summary.json").write_text(json.dumps(summary))

    finish_train_record(tracker=tracker, mlflow_run_id=done, key="k1", out_dir=str(stage_dir), stage=1,
                        summary=summary, extra_metrics={})

    tagged = tracker.runs_tagged({"train_key": "k1"})
    assert list(tagged) == [done] and tagged[done].metrics["train/final_loss"] == 1.5
    assert tracker.run_state(killed).tags["train_key.superseded_by"] == done
    assert set(tracker.runs_tagged({"train_key": "k2"})) == {finished_elsewhere, unfinished_other}
