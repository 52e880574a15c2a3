"""The registered model of every modality works elsewhere: in a fresh virtual environment holding only the models' own
requirements.txt (installed from the package index with pip) and a working directory outside this checkout,
``mlflow.pyfunc.load_model("models:/<name>@current").predict(x)`` gives the embeddings the pipeline's export writes
for the same inputs, for the image, image-text (CLIP), text and embeddings modalities (x: the modality's ``serving``
input: uint8 images, sentences, float32 vectors). ``contrastive`` comes from the model's ``code/`` (its
``code_paths``), never from the checkout: the venv is made without system site-packages (this project is installed
editable in .venv, and the venv made here does not see .venv), and its interpreter runs with ``-I`` (no PYTHONPATH,
no user site, no working directory on sys.path), which the script checks before it loads the model.

One venv holds the union of the four models' requirements (they are pinned to the versions installed here, so
they agree; where they do not, each modality gets its own venv). So that the union cannot hide a requirement one
model forgot and another lists, the script makes every installed distribution that is not among that model's own
requirements or what they depend on missing to the model (what pip installed for the others is hidden).

The text model is the built-in (``tiny``) encoder with its word vocabulary stored in the stage model: an ``hf``
encoder would need ``transformers`` and its checkpoint directory where the model loads, which the registered model
ships neither of (not covered here).

About 3.5 minutes on a quiet 2-core machine (26 Nov 2026; pip installing the union takes 140 s of it, each model
loads and predicts in 10-16 s); 7.5 minutes while the rest of the suite ran beside it.
The venv of a set of pins is kept in ~/.cache/mclpipe/test-venvs (``_venv_holding``) and reused while the pins
are the same, so a run after the first skips the install.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.tasks.test_serving_model import (EXPORT_ATOL, MODALITIES, ONLY_THE_MODELS_REQUIREMENTS, exported,
                                           stages_and_input)

REPO = Path(__file__).resolve().parents[2]
# Run by the fresh venv's interpreter: argv = model uri, input .npy, output .npy, report .json, requirements.txt.
SCRIPT = """
import importlib.util, json, sys, time
for name in ("contrastive", "tasks", "flows", "pipeline_config", "mclpipe"):
    assert importlib.util.find_spec(name) is None, f"{name} is importable before the model loads: {sys.path}"
uri, given, out, report, requirements = sys.argv[1:]

importable_anyway = set()
""" + ONLY_THE_MODELS_REQUIREMENTS + """import numpy as np
import mlflow.pyfunc
start = time.time()
model = mlflow.pyfunc.load_model(uri)
loaded = time.time() - start
np.save(out, model.predict(np.load(given)))
import contrastive, torch
json.dump({"contrastive": contrastive.__file__, "torch": torch.__version__, "mlflow": mlflow.__version__,
           "load_seconds": loaded, "sys_path": sys.path, "hidden": sorted(hidden)}, open(report, "w"))
"""


# ----------------------------------------------------------------------------------------------------- the venv
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


def _venv_groups(requirements: dict[str, Path]) -> list[list[str]]:
    """One group of modalities per venv: all of them when their requirements pin each name alike."""
    pins: dict[str, set[str]] = {}
    for path in requirements.values():
        for line in path.read_text().split():
            pins.setdefault(line.split("==")[0].lower(), set()).add(line)
    return [list(requirements)] if all(len(p) == 1 for p in pins.values()) else [[m] for m in requirements]


# Where the venvs of the models' requirements are kept between runs (MCLPIPE_TEST_VENV_CACHE overrides it).
VENV_CACHE = Path(os.environ.get("MCLPIPE_TEST_VENV_CACHE") or Path.home() / ".cache" / "mclpipe" / "test-venvs")


def _venv_holding(requirement_files: list[Path], *, work: Path, env: dict[str, str], timings: dict,
                  label: str) -> Path:
    """A venv holding exactly these requirements files (installed with pip from the package index), made once per
    Python and set of pinned lines and reused while they are the same: pip installing the union is about 140 s of
    this module's 3.5 minutes, and the pins (torch, mlflow, ... at the versions installed here) change with
    pyproject.toml, not between runs. It is never the project's .venv and nothing but this test installs into it;
    a venv whose install did not finish is never used (it is built beside the cache and moved in when complete)."""
    pins = sorted({line for path in requirement_files for line in path.read_text().split()})
    key = hashlib.sha256("\n".join([sys.version, *pins]).encode()).hexdigest()[:16]
    venv = VENV_CACHE / key
    if (venv / "bin" / "python").exists():
        timings[f"venv {label}"] = 0.0  # reused
        return venv
    VENV_CACHE.mkdir(parents=True, exist_ok=True)
    building = VENV_CACHE / f".building-{key}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    timings[f"venv {label}"] = _run([sys.executable, "-m", "venv", str(building)], cwd=work, env=env, timeout=300)
    timings[f"pip install {label}"] = _run(
        [str(building / "bin" / "python"), "-I", "-m", "pip", "install", "--no-input", "-q",
         *(arg for path in requirement_files for arg in ("-r", str(path)))], cwd=work, env=env, timeout=1500)
    try:
        building.rename(venv)  # `python -m` finds its site-packages from where it runs, so the move keeps it whole
    except OSError:  # another run moved the same venv in first
        shutil.rmtree(building, ignore_errors=True)
    return venv


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Every modality's registered model, its input and the engine's export of that input (the expected output),
    and the venv python that holds its requirements: {modality: {...}}, plus the timings."""
    import mlflow

    from tasks.tracking import Tracker, log_encoder

    tmp = tmp_path_factory.mktemp("fresh")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    tracker = Tracker(uri=uri, experiment="fresh", artifact_root=tmp / "art")
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    models, requirements = {}, {}
    start = time.time()
    for modality in MODALITIES:
        paths, dims, given = stages_and_input(modality, tmp)
        expected = exported(modality, paths, given, tmp)  # the engine's export of the same inputs
        logged = log_encoder(tracker, run, name=f"{modality}-representation", model_paths=paths, dims=dims,
                             modality=modality, registered_name=f"fresh-{modality}")
        np.save(tmp / f"{modality}-input.npy", given)
        models[modality] = {"uri": logged["registered_uri"], "expected": expected, "dims": dims}
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        for modality, model in models.items():
            requirements[modality] = Path(mlflow.pyfunc.get_model_dependencies(model["uri"]))
    finally:
        mlflow.set_tracking_uri(previous)
    timings = {"log 4 models": time.time() - start}

    work = tmp / "elsewhere"  # the fresh interpreter's working directory: outside the checkout
    work.mkdir()
    (work / "predict.py").write_text(SCRIPT)
    env = _clean_env()
    for number, group in enumerate(_venv_groups(requirements)):
        venv = _venv_holding([requirements[m] for m in group], work=work, env=env, timings=timings,
                             label=f"{number} ({', '.join(group)})")
        python = str(venv / "bin" / "python")
        for modality in group:
            models[modality] |= {"python": python, "requirements": requirements[modality]}
    yield {"tmp": tmp, "work": work, "uri": uri, "models": models, "timings": timings}
    print("fresh venv timings (s):", {k: round(v, 1) for k, v in timings.items()})


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("modality", MODALITIES)
def test_the_registered_model_loads_and_predicts_in_a_fresh_venv(served, modality):
    tmp, model = served["tmp"], served["models"][modality]
    report = tmp / f"{modality}-report.json"
    predicted_path = tmp / f"{modality}-predicted.npy"
    served["timings"][f"load and predict {modality}"] = _run(
        [model["python"], "-I", str(served["work"] / "predict.py"), model["uri"], str(tmp / f"{modality}-input.npy"),
         str(predicted_path), str(report), str(model["requirements"])],
        cwd=served["work"], env=_clean_env(MLFLOW_TRACKING_URI=served["uri"]), timeout=600)

    report = json.loads(report.read_text())
    assert not any(p == str(REPO) or p.startswith(f"{REPO}/") for p in report["sys_path"]), report["sys_path"]
    code = Path(report["contrastive"]).parent
    assert REPO not in code.parents and code.parent.name == "code", report["contrastive"]  # the model's code/
    # The other models' requirements were hidden from this one (the union venv cannot stand in for a missing one).
    assert ("open_clip" in report["hidden"], "webdataset" in report["hidden"]) == \
        (modality != "clip", modality in ("text", "embeddings")), report["hidden"]
    predicted, expected = np.load(predicted_path), model["expected"]
    assert predicted.dtype == np.float32 and predicted.shape == expected.shape == (len(expected), sum(model["dims"]))
    np.testing.assert_allclose(predicted, expected, atol=EXPORT_ATOL)
