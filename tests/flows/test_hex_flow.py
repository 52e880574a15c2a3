"""A HEX pipeline under Prefect's test harness: HEX stage beside a no-HEX control, diagnostics logged."""
from mlflow.tracking import MlflowClient

from flows.pipeline import mcl_pipeline
from tests.flows.mlflow_runs import artifact_paths, run_tree


def test_hex_pipeline_has_a_no_hex_control_and_diagnostics(tiny_config):
    config = tiny_config("mcl.num_stages=1", "method.hex.enabled=true", "method.hex.q.value=0.3")
    summary = mcl_pipeline(config)
    assert set(summary["results"]) == {"stage 0", "control (no HEX) stage 0"}
    assert summary["results"]["stage 0"] != summary["results"]["control (no HEX) stage 0"]

    client = MlflowClient(tracking_uri=config.tracking.uri)
    _, children = run_tree(config.tracking.uri)
    runs = {c.data.tags["kind"]: c for c in children}
    assert set(runs) == {"mcl", "control"}
    assert runs["mcl"].data.params["method.hex.enabled"] == "True"
    assert runs["control"].data.params["method.hex.enabled"] == "False"
    assert "hex/mean_hierarchy_size" in runs["mcl"].data.metrics and "hex/epsilon" in runs["mcl"].data.metrics
    assert not any(k.startswith("hex/") for k in runs["control"].data.metrics)
    for run in runs.values():
        assert {"diag/anisotropy", "diag/effective_rank", "diag/alignment", "diag/color/auc"} <= set(run.data.metrics)
        assert "eval/diagnostics/similarity.png" in artifact_paths(client, run.info.run_id)
