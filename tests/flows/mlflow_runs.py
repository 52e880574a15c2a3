"""Reading the MLflow run tree a flow test left behind (shared by the MCL, CLIP and HEX flow tests)."""
from mlflow.tracking import MlflowClient


def run_tree(uri: str) -> tuple[list, list]:
    """(pipeline runs, stage runs) of the "mclpipe" experiment at ``uri``."""
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("mclpipe").experiment_id], max_results=500)
    parents = [r for r in runs if r.data.tags.get("kind") == "pipeline"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    """Every artifact file of a run, as paths relative to its artifact root (folders walked recursively)."""
    out = set()
    for item in client.list_artifacts(run_id, path):
        out |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return out
