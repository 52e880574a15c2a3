"""The registered model works elsewhere: in a fresh virtual environment holding only the model's own
requirements.txt (installed from the package index with pip) and a working directory outside this checkout,
``mlflow.pyfunc.load_model("models:/<name>@current").predict(hwc_images)`` gives the embeddings this process
computes. ``contrastive`` comes from the model's ``code/`` (its ``code_paths``), never from the checkout: the venv
is made without system site-packages (this project is installed editable in .venv, and the venv made here does
not see .venv), and its interpreter runs with ``-I`` (no PYTHONPATH, no user site, no working directory on
sys.path), which the script checks before it loads the model.

About two minutes on a fresh machine: pip downloads torch (with its CUDA libraries) and mlflow; pip's cache makes
later runs faster.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.tasks.test_serving_model import images, tiny_model

REPO = Path(__file__).resolve().parents[2]

# Run by the fresh venv's interpreter: argv = model uri, input .npy, output .npy, report .json.
SCRIPT = """
import importlib.util, json, sys, time
for name in ("contrastive", "tasks", "flows", "pipeline_config", "mclpipe"):
    assert importlib.util.find_spec(name) is None, f"{name} is importable before the model loads: {sys.path}"
import numpy as np
import mlflow.pyfunc
uri, given, out, report = sys.argv[1:]
start = time.time()
model = mlflow.pyfunc.load_model(uri)
loaded = time.time() - start
np.save(out, model.predict(np.load(given)))
import contrastive, torch
json.dump({"contrastive": contrastive.__file__, "torch": torch.__version__, "mlflow": mlflow.__version__,
           "load_seconds": loaded, "sys_path": sys.path}, open(report, "w"))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would point the fresh interpreter back at this checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO)))
    return env | extra


def _run(args: list[str], *, cwd: Path, env: dict[str, str], timeout: int) -> float:
    start = time.time()
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{(result.stdout + result.stderr)[-6000:]}"
    return time.time() - start


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_registered_model_loads_and_predicts_in_a_fresh_venv(tmp_path):
    import mlflow

    from contrastive.integrate import concat_normalized
    from contrastive.modalities.image import serving
    from tasks.tracking import Tracker, log_encoder

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri=uri, experiment="fresh", artifact_root=tmp_path / "art")
    paths = [tiny_model(tmp_path / f"stage{i}.pt", seed=i) for i in range(2)]
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    logged = log_encoder(tracker, run, name="mcl-representation", model_paths=paths, dims=[16, 16],
                         modality="image", registered_name="fresh")
    hwc = images(6, size=16)  # uint8 (n, H, W, C): what a user has
    np.save(tmp_path / "input.npy", hwc)
    expected = concat_normalized(stage_embeddings=[serving.embed(serving.load_encoder(p), hwc) for p in paths])
    np.save(tmp_path / "expected.npy", expected)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        requirements = Path(mlflow.pyfunc.get_model_dependencies(logged["registered_uri"]))
    finally:
        mlflow.set_tracking_uri(previous)

    work = tmp_path / "elsewhere"  # the fresh interpreter's working directory: outside the checkout
    work.mkdir()
    venv = tmp_path / "venv"
    env = _clean_env()
    timings = {"venv": _run([sys.executable, "-m", "venv", str(venv)], cwd=work, env=env, timeout=300)}
    python = str(venv / "bin" / "python")
    timings["pip install"] = _run([python, "-I", "-m", "pip", "install", "--no-input", "-q", "-r", str(requirements)],
                                  cwd=work, env=env, timeout=1200)
    (work / "predict.py").write_text(SCRIPT)
    timings["load and predict"] = _run(
        [python, "-I", str(work / "predict.py"), logged["registered_uri"], str(tmp_path / "input.npy"),
         str(tmp_path / "predicted.npy"), str(tmp_path / "report.json")],
        cwd=work, env=_clean_env(MLFLOW_TRACKING_URI=uri), timeout=600)
    print("fresh venv timings (s):", {k: round(v, 1) for k, v in timings.items()}, "contrastive from",
          json.loads((tmp_path / "report.json").read_text())["contrastive"])

    report = json.loads((tmp_path / "report.json").read_text())
    assert not any(p == str(REPO) or p.startswith(f"{REPO}/") for p in report["sys_path"]), report["sys_path"]
    code = Path(report["contrastive"]).parent
    assert REPO not in code.parents and code.parent.name == "code", report["contrastive"]  # the model's code/
    predicted = np.load(tmp_path / "predicted.npy")
    assert predicted.shape == expected.shape == (6, 32)
    np.testing.assert_allclose(predicted, expected, atol=1e-5)
