"""docs/architecture.md's "what a new modality implements", proven by a modality defined in tests/ alone
(``fifth_modality``) running through the one pipeline flow: the same tasks, stage loop, k-means, pseudo-labels,
MLflow run tree and printout as the four built-in modalities."""
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from contrastive.errors import ConfigError
from contrastive.modalities import registry
from flows.pipeline import mcl_pipeline
from pipeline_config.loader import config_from_dict
from tests.flows import fifth_modality
from tests.flows.mlflow_runs import run_tree

ROOT = Path(__file__).resolve().parents[2]


def test_a_modality_registered_from_the_tests_runs_through_the_one_flow(tmp_path):
    config = config_from_dict({"pipeline": "fifth", "output_dir": str(tmp_path / "runs"),
                               "data": {"cache_dir": str(tmp_path / "data")}, "device": "cpu",
                               "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                                            "system_metrics_seconds": 0},
                               "mcl": {"num_stages": 2, "clusters": 4, "control": False}})
    assert isinstance(config, fifth_modality.FifthConfig) and registry.modality_for("fifth") is fifth_modality.MODALITY
    # Prefect checks a flow's parameters against the configs it knew when flows.pipeline was imported (before this
    # test registered its modality); what runs is the same flow.
    summary = mcl_pipeline.with_options(validate_parameters=False)(config)
    results = summary["results"]
    assert set(results) == {"stage 0", "stage 1", "MCL concat"}
    # Stage 0 finds the strong attribute; the cluster-pure stage 1 (batches from stage 0's k-means) the weak one,
    # which only the flow's pseudo-labels can give it; the concatenation keeps both.
    assert results["stage 0"]["probe/major"] > 0.95 and results["stage 0"]["probe/minor"] < 0.6
    assert results["stage 1"]["probe/minor"] > 0.9
    assert min(results["MCL concat"]["probe/major"], results["MCL concat"]["probe/minor"]) > 0.9
    parents, children = run_tree(config.tracking.uri)
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert parents[0].data.tags["modality"] == fifth_modality.MODALITY.title
    assert sorted((c.data.tags["kind"], c.data.tags["stage"], c.info.status) for c in children) == [
        ("mcl", "0", "FINISHED"), ("mcl", "1", "FINISHED")]
    stage1 = next(c for c in children if c.data.tags["stage"] == "1")
    assert stage1.data.tags["cluster_pure_batches"] == "True" and "train/final_loss" in stage1.data.metrics
    files = {a.path for a in MlflowClient(tracking_uri=config.tracking.uri).list_artifacts(stage1.info.run_id)}
    assert {"model", "clusters", "pseudo_labels"} <= files


def test_the_fifth_modality_changes_no_file_outside_tests():
    """No file outside tests/, tracked or new, names it: git grep exits 1 (nothing found); 0 lists the files, and
    anything else (128: not a checkout) is no answer, so the test fails rather than passing on empty output."""
    named = subprocess.run(["git", "grep", "--untracked", "-l", "fifth_modality\\|FifthModality", "--", ":!tests"],
                           cwd=ROOT, capture_output=True, text=True)
    assert (named.returncode, named.stdout) == (1, ""), named.stderr or named.stdout


@pytest.mark.parametrize("key", [*registry.PACKAGES, *registry.ALIASES])
def test_a_built_in_key_cannot_be_taken(key):
    """Every built-in key (the four packages' and the old alias ``mcl``) is refused, and keeps its modality."""
    class Impostor(fifth_modality.FifthModality):
        name = key
    built_in = registry.modality_for(key)
    with pytest.raises(ConfigError, match="another name"):
        registry.register(Impostor(), fifth_modality.FifthConfig)
    assert registry.modality_for(key) is built_in and not isinstance(built_in, Impostor)
