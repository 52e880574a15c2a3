"""The registered model of every modality works elsewhere: in a fresh virtual environment holding only the models'
own requirements.txt (installed from the package index with pip) and a working directory outside this checkout,
``mlflow.pyfunc.load_model("models:/<name>@current").predict(x)`` gives the embeddings this process computes, for
the image, image-text (CLIP), text and embeddings modalities (x: the modality's ``serving`` input: uint8 images,
sentences, float32 vectors). ``contrastive`` comes from the model's ``code/`` (its ``code_paths``), never from the
checkout: the venv is made without system site-packages (this project is installed editable in .venv, and the venv
made here does not see .venv), and its interpreter runs with ``-I`` (no PYTHONPATH, no user site, no working
directory on sys.path), which the script checks before it loads the model.

One venv holds the union of the four models' requirements (they are pinned to the versions installed here, so
they agree; where they do not, each modality gets its own venv). So that the union cannot hide a requirement one
model forgot and another lists, the script makes every installed distribution that is not among that model's own
requirements or what they depend on missing to the model (what pip installed for the others is hidden).

The text model is the built-in (``tiny``) encoder with its word vocabulary stored in the stage model: an ``hf``
encoder would need ``transformers`` and its checkpoint directory where the model loads, which the registered model
ships neither of (not covered here).

About 3.5 minutes on a quiet 2-core machine (26 Nov 2026; pip installing the union takes 140 s of it, each model
loads and predicts in 10-16 s); 7.5 minutes while the rest of the suite ran beside it.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tasks.test_serving_model import images, tiny_model

REPO = Path(__file__).resolve().parents[2]
MODALITIES = ("image", "clip", "text", "embeddings")  # the pipeline keys (clip: the image_text package)
SENTENCES = ["a red square left of a blue circle", "two green triangles", "the circle is above the square",
             "a blue square", "nothing at all", "green circle, red triangle"]

# Run by the fresh venv's interpreter: argv = model uri, input .npy, output .npy, report .json, requirements.txt.
SCRIPT = """
import importlib.util, json, sys, time
for name in ("contrastive", "tasks", "flows", "pipeline_config", "mclpipe"):
    assert importlib.util.find_spec(name) is None, f"{name} is importable before the model loads: {sys.path}"
uri, given, out, report, requirements = sys.argv[1:]

# The venv may hold other models' requirements too: this model finds no installed distribution that is neither one of
# its requirements nor what they depend on, as in a venv made from its requirements alone (sys.path's finder is
# wrapped, so such a module is missing to imports, importlib.util.find_spec and importlib.metadata alike).
from importlib.machinery import PathFinder
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
needed, todo = {"pip", "setuptools"}, [Requirement(line).name for line in open(requirements).read().split()]
while todo:
    name = canonicalize_name(todo.pop())
    if name in needed:
        continue
    needed.add(name)
    try:
        todo += [r.name for r in map(Requirement, distribution(name).requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
    except PackageNotFoundError:  # a dependency for another platform or Python
        pass
hidden = {top for top, dists in packages_distributions().items() if not {canonicalize_name(d) for d in dists} & needed}


class OnlyThisModelsRequirements(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in hidden else super().find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):  # their metadata is missing too
        return (d for d in super().find_distributions(*args, **kwargs) if canonicalize_name(d.name) in needed)


sys.meta_path[:] = [OnlyThisModelsRequirements if finder is PathFinder else finder for finder in sys.meta_path]
import numpy as np
import mlflow.pyfunc
start = time.time()
model = mlflow.pyfunc.load_model(uri)
loaded = time.time() - start
np.save(out, model.predict(np.load(given)))
import contrastive, torch
json.dump({"contrastive": contrastive.__file__, "torch": torch.__version__, "mlflow": mlflow.__version__,
           "load_seconds": loaded, "sys_path": sys.path, "hidden": sorted(hidden)}, open(report, "w"))
"""


# --------------------------------------------------------------------------------------------- tiny stage models
def _clip_stage(path: Path, *, seed: int) -> str:
    """A seeded random-init tiny CLIP stage model as training saves it (spec + trainable parameters)."""
    from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip, save_stage_model
    bundle = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=seed, trainable_image_blocks=1))
    return str(save_stage_model(model=bundle.model, spec=bundle.spec, path=path, weights_file=bundle.weights_file))


def _text_stage(path: Path, *, seed: int) -> str:
    """A seeded tiny SimCSE stage (built-in encoder, word vocabulary) as text's steps save it."""
    from contrastive.engine.checkpoint import save_torch
    from contrastive.modalities.text.encoders import TextEncoderSpec
    from contrastive.modalities.text.steps import build_text_method
    from contrastive.modalities.text.tokenizer import WordTokenizer
    encoder = TextEncoderSpec(dim=16, depth=1, heads=2, max_length=16).to_json()
    method = {"name": "simcse_unsup", "temperature": 0.05, "mlp_head": True}
    vocab = WordTokenizer.build(SENTENCES[:4]).vocab  # later sentences hold unknown words
    torch.manual_seed(seed)
    model, _ = build_text_method(encoder=encoder, method=method, vocab=vocab)
    save_torch({"state_dict": model.state_dict(), "encoder": encoder, "method": method, "vocab": vocab}, path,
               what="a test model")
    return str(path)


def _feature_stage(path: Path, *, seed: int) -> str:
    """A seeded MLP stage of the embeddings modality as its steps save it."""
    from contrastive.engine.checkpoint import save_torch
    from contrastive.modalities.embeddings.steps import build_model
    encoder = {"hidden": 16, "depth": 2, "dim": 8, "projection_dim": 4}
    torch.manual_seed(seed)
    model = build_model(in_dim=10, encoder=encoder, temperature=0.2)
    save_torch({"state_dict": model.state_dict(), "in_dim": 10, "encoder": encoder, "views": {"temperature": 0.2}},
               path, what="a test model")
    return str(path)


def _stages_and_input(modality: str, tmp: Path) -> tuple[list[str], list[int], np.ndarray]:
    """Two stage model files of ``modality``, their dims, and a serving input."""
    directory = tmp / modality
    if modality == "image":
        return [tiny_model(tmp / f"image{i}.pt", seed=i) for i in range(2)], [16, 16], images(6, size=16)
    if modality == "clip":  # the serving copy is named after the stage directory: stage<i>/model/model.pt
        paths = [_clip_stage(directory / f"stage{i}" / "model" / "model.pt", seed=i) for i in range(2)]
        return paths, [32, 32], images(4, size=40)
    directory.mkdir(parents=True)
    if modality == "text":
        return [_text_stage(directory / f"m{i}.pt", seed=i) for i in range(2)], [16, 16], np.array(SENTENCES)
    vectors = np.random.default_rng(0).normal(size=(6, 10)).astype(np.float32)
    return [_feature_stage(directory / f"m{i}.pt", seed=i) for i in range(2)], [8, 8], vectors


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


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Every modality's registered model, its input and this process's embeddings, and the venv python that
    holds its requirements: {modality: {...}}, plus the timings."""
    import mlflow

    from contrastive.integrate import concat_normalized
    from contrastive.modalities.registry import modality_for
    from tasks.tracking import Tracker, log_encoder

    tmp = tmp_path_factory.mktemp("fresh")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    tracker = Tracker(uri=uri, experiment="fresh", artifact_root=tmp / "art")
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    models, requirements = {}, {}
    start = time.time()
    for modality in MODALITIES:
        paths, dims, given = _stages_and_input(modality, tmp)
        plugin = modality_for(modality)
        expected = concat_normalized(stage_embeddings=[plugin.embed(plugin.load_encoder(p), given) for p in paths])
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
        venv = tmp / f"venv{number}"
        timings[f"venv {number}"] = _run([sys.executable, "-m", "venv", str(venv)], cwd=work, env=env, timeout=300)
        python = str(venv / "bin" / "python")
        timings[f"pip install {number} ({', '.join(group)})"] = _run(
            [python, "-I", "-m", "pip", "install", "--no-input", "-q",
             *(arg for m in group for arg in ("-r", str(requirements[m])))], cwd=work, env=env, timeout=1500)
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
    np.testing.assert_allclose(predicted, expected, atol=1e-5)
