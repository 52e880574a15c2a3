"""The registered model's input: one stage's image encoder embeds the same pixels identically in every accepted
layout (NCHW, NHWC, one image, a list of arrays, PIL images), refuses anything else with the layouts it takes, and
``log_encoder`` logs it with the modality, a signature, a description and installable requirements."""
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from contrastive.engine.checkpoint import save_torch
from contrastive.methods import build_method
from contrastive.modalities.image import serving
from contrastive.modalities.registry import modality_for

METHOD = dict(name="simclr", temperature=0.5)
#: The export stores float16 embeddings: a served float32 row matches it to about 1e-3 after normalisation (a wrong
#: transform, channel order or stage order differs by far more).
EXPORT_ATOL = 2e-3
MODALITIES = ("image", "clip", "text", "embeddings")  # the pipeline keys (clip: the image_text package)
SENTENCES = ["a red square left of a blue circle", "two green triangles", "the circle is above the square",
             "a blue square", "nothing at all", "green circle, red triangle"]

# Python run before a model loads, given ``requirements`` (the path of the model's requirements.txt) and
# ``importable_anyway`` (top-level names to leave importable):
ONLY_THE_MODELS_REQUIREMENTS = """
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
hidden -= importable_anyway


class OnlyThisModelsRequirements(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in hidden else super().find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):  # their metadata is missing too
        return (d for d in super().find_distributions(*args, **kwargs) if canonicalize_name(d.name) in needed)


sys.meta_path[:] = [OnlyThisModelsRequirements if finder is PathFinder else finder for finder in sys.meta_path]
"""


def tiny_model(path: Path, *, channels: int = 3, seed: int = 0) -> str:
    """A small CNN stage model as training saves it (``model.pt``), without training."""
    torch.manual_seed(seed)
    model_kwargs = dict(encoder="small_cnn", widths=[8, 16], projection_hidden=16, projection_dim=8,
                        in_channels=channels)
    method = build_method(model_kwargs=model_kwargs, method_kwargs=METHOD)
    save_torch({"state_dict": method.state_dict(), "model_kwargs": model_kwargs, "method_kwargs": METHOD}, path,
               what="a test model")
    return str(path)


def images(n: int = 5, *, size: int = 12, channels: int = 3, seed: int = 0) -> np.ndarray:
    """uint8 (n, H, W, C)."""
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, channels), dtype=np.uint8)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return serving.load_encoder(tiny_model(tmp_path_factory.mktemp("serving") / "model.pt"))


def test_every_layout_of_the_same_pixels_gives_the_same_embeddings(encoder):
    from PIL import Image
    hwc = images()
    expected = serving.embed(encoder, hwc)
    assert expected.dtype == np.float32 and expected.shape == (5, 16)
    nchw = np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))
    for same in (nchw, list(hwc), [Image.fromarray(image) for image in hwc], tuple(nchw),
                 torch.from_numpy(hwc)):
        np.testing.assert_array_equal(serving.embed(encoder, same), expected)
    one = serving.embed(encoder, hwc[2])  # one image, HWC (a batch of one: float sums in another order)
    np.testing.assert_allclose(one, expected[2:3], atol=1e-6)
    np.testing.assert_array_equal(serving.embed(encoder, nchw[2]), one)  # one image, CHW
    np.testing.assert_array_equal(serving.embed(encoder, Image.fromarray(hwc[2])), one)


def test_the_transform_is_the_exports(encoder):
    """Pixels / 255 on the stage model's own ``embed``: what the export writes (steps.export_stage_embeddings)."""
    hwc = images()
    with torch.no_grad():
        direct = encoder.model.embed(torch.from_numpy(hwc).permute(0, 3, 1, 2).float() / 255.0).numpy()
    np.testing.assert_allclose(serving.embed(encoder, hwc), direct, atol=1e-6)
    np.testing.assert_allclose(serving.embed(encoder, images(300), batch_size=128)[:5],
                               serving.embed(encoder, images(300)[:5]), atol=1e-6)  # nor do the batches


def test_pil_images_are_converted_to_the_encoders_channels(encoder):
    from PIL import Image
    gray = images(2, channels=1)[..., 0]
    as_rgb = [Image.fromarray(g, mode="L").convert("RGB") for g in gray]
    np.testing.assert_array_equal(serving.embed(encoder, [Image.fromarray(g, mode="L") for g in gray]),
                                  serving.embed(encoder, as_rgb))


def test_one_and_four_channel_encoders(tmp_path):
    from PIL import Image
    one = serving.load_encoder(tiny_model(tmp_path / "one.pt", channels=1))
    gray = images(3, channels=1)
    expected = serving.embed(one, gray)
    for same in (gray.transpose(0, 3, 1, 2), [g[..., 0] for g in gray], [Image.fromarray(g[..., 0]) for g in gray]):
        np.testing.assert_array_equal(serving.embed(one, same), expected)
    four = serving.load_encoder(tiny_model(tmp_path / "four.pt", channels=4))
    rgba = images(2, channels=4)
    np.testing.assert_array_equal(serving.embed(four, [Image.fromarray(x, mode="RGBA") for x in rgba]),
                                  serving.embed(four, rgba.transpose(0, 3, 1, 2)))
    with pytest.raises(ValueError, match="4-channel"):
        serving.embed(four, [Image.fromarray(images(1)[0])])


def test_an_ambiguous_shape_is_read_channels_last():
    x = images(2, size=3)  # (2, 3, 3, 3): both axis 1 and axis 3 could hold the channels
    np.testing.assert_array_equal(serving.as_nchw(x, channels=3), x.transpose(0, 3, 1, 2))
    y = np.zeros((2, 3, 5, 3), np.uint8)
    np.testing.assert_array_equal(serving.as_nchw(y, channels=3), y.transpose(0, 3, 1, 2))
    assert serving.as_nchw(np.zeros((2, 3, 5, 7), np.uint8), channels=3).shape == (2, 3, 5, 7)


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 12, 12, 2), np.uint8), r"shape \(2, 12, 12, 2\).*\(n, H, W, C\) or \(n, C, H, W\)"),
    (np.zeros((2, 1, 12, 12, 3), np.uint8), r"shape \(2, 1, 12, 12, 3\).*\(n, H, W, C\)"),
    (np.zeros((12, 12), np.uint8), r"shape \(12, 12\).*3-channel"),
    (np.zeros((0, 12, 12, 3), np.uint8), "no images"),
    ([], "no images"),
    (np.zeros((2, 12, 12, 3), np.float32), r"dtype float32.*uint8"),
    ([np.zeros((12, 12, 3), np.uint8), np.zeros((10, 10, 3), np.uint8)], "differ in size"),
    ([np.zeros((12, 12, 3), np.uint8), "a path"], r"image 1 of the list is a str"),
    ("a path", r"the input is a str.*\(n, H, W, C\)"),
])
def test_anything_else_is_refused_naming_the_layouts(encoder, bad, message):
    with pytest.raises(ValueError, match=message):
        serving.embed(encoder, bad)


# ---------------------------------------------------------------------------------------------------- logged model
@pytest.fixture
def tracker(tmp_path):
    """A sqlite store in tmp_path, also where mlflow's ``models:/`` URIs are looked up while the test runs."""
    from tasks.tracking import Tracker
    tracker = Tracker(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="t", artifact_root=tmp_path / "art")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracker.uri)
    yield tracker
    mlflow.set_tracking_uri(previous)


def test_the_logged_model_says_what_it_takes_and_embeds_every_layout(tracker, tmp_path):
    from tasks.tracking import log_encoder
    paths = [tiny_model(tmp_path / f"stage{i}.pt", seed=i) for i in range(2)]
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    logged = log_encoder(tracker, run, name="mcl-representation", model_paths=paths, dims=[16, 16],
                         modality="image", registered_name="tiny")
    info = mlflow.models.get_model_info(logged["registered_uri"])
    assert info.metadata["input"] == modality_for("image").serving.description
    assert info.metadata["modality"] == "image"
    assert "(n, H, W, C) or (n, C, H, W)" in info.metadata["description"]
    [given], [out] = info.signature.inputs.inputs, info.signature.outputs.inputs
    assert (given.type, given.shape, out.type, out.shape) == (np.dtype("uint8"), (-1, -1, -1, -1),
                                                              np.dtype("float32"), (-1, 32))
    version = tracker.client.get_model_version("tiny", logged["version"])
    assert "uint8 images (n, H, W, C)" in version.description

    model = mlflow.pyfunc.load_model(logged["registered_uri"])
    hwc = images()
    expected = exported("image", paths, hwc, tmp_path)  # the engine's export of the same images
    np.testing.assert_allclose(model.predict(hwc), expected, atol=EXPORT_ATOL)
    np.testing.assert_allclose(model.predict(np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))), expected,
                               atol=EXPORT_ATOL)
    ragged = np.empty(len(hwc), dtype=object)  # a list of images that MLflow's signature check lets through
    ragged[:] = list(hwc)
    np.testing.assert_allclose(model.predict(ragged), expected, atol=EXPORT_ATOL)
    with pytest.raises(ValueError, match=r"\(n, H, W, C\) or \(n, C, H, W\)"):
        model.unwrap_python_model().predict(None, np.zeros((2, 12, 12, 2), np.uint8))


def test_a_model_of_an_earlier_run_that_stores_the_old_image_key_still_loads(tracker, tmp_path):
    """Models registered before the image key was ``image`` store ``mcl`` as their modality."""
    from tasks.tracking import log_encoder
    path = tiny_model(tmp_path / "stage0.pt")
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    logged = log_encoder(tracker, run, name="old", model_paths=[path], dims=[16], modality="mcl")
    assert mlflow.models.get_model_info(logged["model_uri"]).metadata["modality"] == "mcl"
    model = mlflow.pyfunc.load_model(logged["model_uri"])
    np.testing.assert_allclose(model.predict(images()), exported("image", [path], images(), tmp_path),
                               atol=EXPORT_ATOL)


def test_the_model_ships_contrastive_and_installable_pinned_requirements(tracker, tmp_path):
    from importlib.metadata import version

    from tasks.tracking import log_encoder
    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    logged = log_encoder(tracker, run, name="stage0-encoder", model_paths=[tiny_model(tmp_path / "m.pt")], dims=[16],
                         modality="image")
    local = Path(mlflow.artifacts.download_artifacts(logged["model_uri"], dst_path=str(tmp_path / "dl")))
    requirements = (local / "requirements.txt").read_text().split()
    names = [line.split("==")[0] for line in requirements]
    assert "mclpipe" not in names and {"torch", "torchvision", "numpy", "mlflow"} <= set(names)
    for line in requirements:
        name, pinned = line.split("==")
        assert pinned == version(name).split("+")[0], line
    code = local / "code"
    assert sorted(p.name for p in code.iterdir()) == ["contrastive"]
    assert (code / "contrastive" / "modalities" / "image" / "serving.py").is_file()
    assert not list(code.rglob("__pycache__")) and not list(code.rglob("*.pyc"))


def test_every_modality_serves_a_model_whose_requirements_are_installed_distributions():
    """What the registry hands out names only distributions pip can install (found installed here, so the pins
    resolve), for every registered modality."""
    from importlib.metadata import version

    from contrastive.modalities.registry import PACKAGES, modality_for
    from tasks.tracking import serving_requirements
    for key in PACKAGES:
        serving = modality_for(key).serving
        assert serving is not None and serving.description, key
        for line in serving_requirements(key):
            name, pinned = line.split("==")
            assert pinned == version(name).split("+")[0], (key, line)


@pytest.mark.parametrize("modality", ["embeddings", "clip"])  # clip ships a serving copy written to a temp dir
def test_the_saved_model_names_no_path_of_the_machine_that_wrote_it(tmp_path, modality):
    """A logged model is kept under the run directory (``runs/mlartifacts``), which may move (issue 47): its files
    name each stage's source relative to the run root (``source_root``), not the absolute path MLflow records,
    and the model still loads its stages (MLflow reads each artifact's ``path`` inside the model)."""
    import os
    import tempfile

    import yaml

    from tasks.tracking.serving_model import save_encoder
    root = tmp_path / "runs"
    paths, dims, given = stages_and_input(modality, root / "steps")
    save_encoder(tmp_path / "model", model_paths=paths, dims=dims, modality=modality, source_root=root)
    artifacts = yaml.safe_load((tmp_path / "model" / "MLmodel").read_text())["flavors"]["python_function"]["artifacts"]
    assert [artifacts[f"stage{i}"]["uri"] for i in range(2)] == [str(Path(p).relative_to(root)) for p in paths]
    for path in (tmp_path / "model").rglob("*"):
        if path.is_file():
            text = path.read_bytes()
            assert str(tmp_path).encode() not in text and os.path.join(tempfile.gettempdir(), "tmp").encode() not in text, path
    assert mlflow.pyfunc.load_model(str(tmp_path / "model")).predict(given).shape == (len(given), sum(dims))


# Run by this venv's interpreter with -I outside the checkout: argv = model directory, input .npy, output .npy,
# report .json. ``contrastive`` stays importable from the checkout (its editable install), but the model's own
# code/ comes first on sys.path, and the report says which one loaded.
ISOLATED_PREDICT = """
import json, sys
model_dir, given, out, report = sys.argv[1:]
requirements, importable_anyway = f"{model_dir}/requirements.txt", {"contrastive"}
""" + ONLY_THE_MODELS_REQUIREMENTS + """
import numpy as np
import mlflow.pyfunc
np.save(out, mlflow.pyfunc.load_model(model_dir).predict(np.load(given)))
import contrastive
json.dump({"contrastive": contrastive.__file__, "hidden": sorted(hidden)}, open(report, "w"))
"""


@pytest.mark.parametrize("modality", MODALITIES)
def test_each_modality_model_loads_and_predicts_with_only_its_own_requirements(tmp_path, modality):
    """The quick form of tests/e2e/test_model_fresh_venv.py (no pip install): in this venv, every installed
    distribution outside the model's requirements.txt and their dependencies is missing, as where the model is
    deployed; a module of ``contrastive`` that a serving path imports and that needs another distribution (the
    image data loading's webdataset for a text model) fails here, not only in the slow suite."""
    import json
    import subprocess
    import sys

    from tasks.tracking.serving_model import save_encoder
    paths, dims, given = stages_and_input(modality, tmp_path)
    expected = exported(modality, paths, given, tmp_path)
    save_encoder(tmp_path / "model", model_paths=paths, dims=dims, modality=modality)
    np.save(tmp_path / "input.npy", given)
    (elsewhere := tmp_path / "elsewhere").mkdir()
    (elsewhere / "predict.py").write_text(ISOLATED_PREDICT)
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-I", "predict.py", str(tmp_path / "model"), str(tmp_path / "input.npy"),
         str(tmp_path / "predicted.npy"), str(report)], cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(report.read_text())
    assert Path(report["contrastive"]).parents[1] == tmp_path / "model" / "code", report["contrastive"]
    assert {"prefect", "tasks", "flows"} <= set(report["hidden"])
    assert ("webdataset" in report["hidden"]) == (modality in ("text", "embeddings")), report["hidden"]
    np.testing.assert_allclose(np.load(tmp_path / "predicted.npy"), expected, atol=EXPORT_ATOL)


# --------------------------------------------------------------------------------------------- tiny stage models
def clip_stage(path: Path, *, seed: int) -> str:
    """A seeded random-init tiny CLIP stage model as training saves it (spec + trainable parameters)."""
    from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip, save_stage_model
    bundle = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=seed, trainable_image_blocks=1))
    return str(save_stage_model(model=bundle.model, spec=bundle.spec, path=path, weights_file=bundle.weights_file))


def text_stage(path: Path, *, seed: int) -> str:
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


def feature_stage(path: Path, *, seed: int) -> str:
    """A seeded MLP stage of the embeddings modality as its steps save it."""
    from contrastive.engine.checkpoint import save_torch
    from contrastive.modalities.embeddings.steps import build_model
    encoder = {"hidden": 16, "depth": 2, "dim": 8, "projection_dim": 4}
    torch.manual_seed(seed)
    model = build_model(in_dim=10, encoder=encoder, temperature=0.2)
    save_torch({"state_dict": model.state_dict(), "in_dim": 10, "encoder": encoder, "views": {"temperature": 0.2}},
               path, what="a test model")
    return str(path)


# ---------------------------------------------------------------------------------------------------- the engine's export
def exported(modality: str, paths: list[str], given, tmp: Path) -> np.ndarray:
    """What the pipeline's own export writes for the serving input ``given`` (float32, in ``given``'s order; of
    several stages L2-normalised per stage and concatenated): the inputs written as a user's data (a folder of PNGs, PNG shards, a text
    file of sentences, an .npy of vectors), prepared as the pipeline prepares it, and each stage exported by the
    modality's export step. The expected output of the registered model from a path independent of the serving
    code it wraps (``plugin.load_encoder`` / ``plugin.embed``)."""
    from PIL import Image

    from contrastive.embeddings import load_embeddings
    from contrastive.integrate import concat_normalized
    root = tmp / f"export-{modality}"
    if modality == "image":
        from contrastive.modalities.image.datasets.image_folder import prepare_image_folder
        from contrastive.modalities.image.steps import export_stage_embeddings
        (root / "source" / "a").mkdir(parents=True)
        keys = [f"a/{i:03d}.png" for i in range(len(given))]
        for key, image in zip(keys, given):
            Image.fromarray(image).save(root / "source" / key)
        dataset = prepare_image_folder(source=root / "source", root=root / "prepared", image_size=given.shape[1],
                                       storage="files")
        export = lambda path, out: export_stage_embeddings(dataset_dir=dataset, model_path=path, out_dir=out,  # noqa: E731
                                                           batch_size=4, device="cpu")
    elif modality == "clip":
        from contrastive.modalities.image_text.data import TAR_END, encode_image, sample_members
        from contrastive.modalities.image_text.steps import export_stage
        keys = [f"{i:09d}" for i in range(len(given))]
        root.mkdir(parents=True)
        shard = root / "00000.tar"
        shard.write_bytes(b"".join(sample_members({"__key__": key, "png": encode_image(image, fmt="png"),
                                                   "txt": b"a picture"}) for key, image in zip(keys, given))
                          + TAR_END)
        export = lambda path, out: export_stage(model_path=path, urls=[str(shard)], out_dir=str(out),  # noqa: E731
                                                batch_size=4, device="cpu", max_skip_fraction=0.0)
    elif modality == "text":
        from contrastive.modalities.text.dataset import prepare_text_files
        from contrastive.modalities.text.steps import export_text_embeddings
        root.mkdir(parents=True)
        (root / "sentences.txt").write_text("".join(f"{sentence}\n" for sentence in given))
        dataset = prepare_text_files(root=root / "prepared", sentences_path=root / "sentences.txt")
        keys = [f"s{i:08d}" for i in range(len(given))]
        export = lambda path, out: export_text_embeddings(dataset_dir=dataset, model_path=path, out_dir=out,  # noqa: E731
                                                          batch_size=4, device="cpu")
    else:
        from contrastive.modalities.embeddings.data import prepare_feature_files
        from contrastive.modalities.embeddings.steps import export_feature_embeddings
        root.mkdir(parents=True)
        np.save(root / "vectors.npy", given)
        dataset = prepare_feature_files(root=root / "prepared", features_path=root / "vectors.npy", ids_path=None,
                                        labels_path=None, test_fraction=0.0, seed=0)
        keys = None  # the rows' own ids, in the file's order
        export = lambda path, out: export_feature_embeddings(dataset_dir=str(dataset), model_path=path,  # noqa: E731
                                                             out_dir=str(out), batch_size=4, device="cpu")
    stages = []
    for number, path in enumerate(paths):
        export(path, root / f"stage{number}")
        ids, z = load_embeddings(directory=root / f"stage{number}")
        order = np.arange(len(ids)) if keys is None else [ids.tolist().index(key) for key in keys]
        assert len(ids) == len(given)
        stages.append(np.asarray(z, dtype=np.float32)[order])
    return stages[0] if len(stages) == 1 else concat_normalized(stage_embeddings=stages)  # as the pipeline serves


def stages_and_input(modality: str, tmp: Path) -> tuple[list[str], list[int], np.ndarray]:
    """Two stage model files of ``modality``, their dims, and a serving input."""
    directory = tmp / modality
    if modality == "image":
        return [tiny_model(tmp / f"image{i}.pt", seed=i) for i in range(2)], [16, 16], images(6, size=16)
    if modality == "clip":  # the serving copy is named after the stage directory: stage<i>/model/model.pt
        paths = [clip_stage(directory / f"stage{i}" / "model" / "model.pt", seed=i) for i in range(2)]
        return paths, [32, 32], images(4, size=40)
    directory.mkdir(parents=True)
    if modality == "text":
        return [text_stage(directory / f"m{i}.pt", seed=i) for i in range(2)], [16, 16], np.array(SENTENCES)
    vectors = np.random.default_rng(0).normal(size=(6, 10)).astype(np.float32)
    return [feature_stage(directory / f"m{i}.pt", seed=i) for i in range(2)], [8, 8], vectors
