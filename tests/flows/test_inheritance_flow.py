"""mcl.inherit and mcl.cumulative_concat through the MCL flow: stage j starts from stage j-1's model, and the
concatenations of stages 0..j are evaluated."""
from pathlib import Path

from contrastive.modalities.image import steps as stages
from flows.pipeline import mcl_pipeline


def test_inheritance_chains_the_stages_and_cumulative_concats(tiny_config, monkeypatch):
    specs = {}
    real = stages.train_stage

    def recorded(spec, **kwargs):
        specs[Path(spec.stage_dir).name.split("-")[0]] = spec
        return real(spec, **kwargs)

    monkeypatch.setattr(stages, "train_stage", recorded)
    summary = mcl_pipeline(tiny_config("mcl.control=false", "mcl.inherit=true", "mcl.cumulative_concat=true"))
    assert specs["train0"].init_model_path is None
    assert specs["train1"].init_model_path == str(Path(specs["train0"].stage_dir) / "model" / "model.pt")
    assert specs["train2"].init_model_path == str(Path(specs["train1"].stage_dir) / "model" / "model.pt")
    assert {"stage 0", "stage 1", "stage 2", "MCL concat 0-1", "MCL concat"} <= set(summary["results"])
    assert "probe/shape" in summary["results"]["MCL concat 0-1"]
