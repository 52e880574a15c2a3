"""Issue 36: nothing mclpipe reads can run code. A planted pickle (an object whose ``__reduce__`` creates a
sentinel file when it is unpickled) at each path mclpipe loads a torch file from is refused with one line naming
the file, and the sentinel never appears; files of earlier versions load, or are refused with the command that
converts them."""
import dataclasses
import hashlib
import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from contrastive.engine import checkpoint as ckpt
from contrastive.engine.safe_load import UnsafeFileError
from contrastive.errors import DataError


def _create_sentinel(path: str) -> None:
    Path(path).write_text("the planted pickle ran")


class Planted:
    """Unpickling this calls ``_create_sentinel(sentinel)``, as a pickled ``os.system`` would run its command."""

    def __init__(self, sentinel: Path):
        self.sentinel = str(sentinel)

    def __reduce__(self):
        return _create_sentinel, (self.sentinel,)


@pytest.fixture
def sentinel(tmp_path):
    path = tmp_path / "SENTINEL"
    yield path
    assert not path.exists(), "the planted pickle ran"


def plant(path: Path, sentinel: Path, *, key: str = "state_dict", stamped: bool = False, **extra) -> Path:
    """A torch file at ``path``: a dict whose ``key`` holds the planted object; ``stamped``: with a valid
    embedded digest, as a checkpoint carries it."""
    buffer = io.BytesIO()
    torch.save({key: Planted(sentinel), **extra}, buffer)
    payload = ckpt._stamped(buffer.getvalue())[0] if stamped else buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


def assert_refused(exc_info, path: Path, *, names_object: bool = True) -> None:
    message = str(exc_info.value)
    assert "\n" not in message and str(path) in message
    assert "_create_sentinel" in message or not names_object  # the object it would have called, where torch says
    assert "mclpipe convert-checkpoint" in message


def test_the_planted_pickle_does_run_when_unpickled(tmp_path, sentinel):
    """The control: what every test here refuses would have run under the old ``weights_only=False``."""
    path = plant(tmp_path / "model.pt", sentinel)
    torch.load(path, weights_only=False)
    assert sentinel.exists()
    sentinel.unlink()


# ---------------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("digest", ["embedded", "beside"])
def test_a_planted_checkpoint_with_a_valid_digest_is_refused(tmp_path, sentinel, digest):
    path = plant(tmp_path / "checkpoints" / "last.pt", sentinel, key="model", stamped=digest == "embedded", step=3)
    if digest == "beside":  # the earlier format: its SHA-256 in last.pt.sha256 (anyone can compute it)
        ckpt._digest_path(path).write_text(hashlib.sha256(path.read_bytes()).hexdigest())
    assert ckpt.verified_checkpoint(path) == path
    with pytest.raises(UnsafeFileError) as refused:
        ckpt.load_checkpoint(path)
    assert_refused(refused, path)


def test_a_planted_checkpoint_is_refused_by_a_resuming_stage(tmp_path, sentinel, feature_data):
    from contrastive.modalities.embeddings.steps import train_feature_stage
    spec = _feature_spec(tmp_path / "stage", feature_data)
    path = plant(tmp_path / "stage" / "checkpoints" / "last.pt", sentinel, key="model", stamped=True, step=3)
    with pytest.raises(UnsafeFileError) as refused:
        train_feature_stage(spec)
    assert_refused(refused, path)


def test_a_checkpoint_of_the_earlier_format_is_refused_then_converted_and_resumes(tmp_path):
    """Before this change a checkpoint held numpy's RNG state as a numpy array (a pickled numpy global) and its
    digest beside it: refused with the command, which converts it to a file that loads and restores the RNG."""
    from contrastive.engine.rng import capture_rng, restore_rng
    np.random.seed(11)
    old_rng = {**capture_rng(), "numpy": np.random.get_state()}  # as the earlier capture_rng stored it
    expected = np.random.random(3)
    path = tmp_path / "last.pt"
    buffer = io.BytesIO()
    torch.save({"model": {"w": torch.ones(2)}, "rng": old_rng, "rng_by_rank": [old_rng], "step": 4}, buffer)
    path.write_bytes(buffer.getvalue())
    ckpt._digest_path(path).write_text(hashlib.sha256(buffer.getvalue()).hexdigest())

    with pytest.raises(UnsafeFileError) as refused:
        ckpt.load_checkpoint(path)
    message = str(refused.value)
    assert "\n" not in message and f"mclpipe convert-checkpoint {path}" in message and "numpy" in message

    assert "converted" in ckpt.convert_to_safe_format(path)
    assert not ckpt._digest_path(path).exists() and ckpt.verified_checkpoint(path) == path
    state = ckpt.load_checkpoint(path)
    assert state["step"] == 4 and torch.equal(state["model"]["w"], torch.ones(2))
    np.random.seed(0)
    restore_rng(state["rng_by_rank"][0])
    np.testing.assert_array_equal(np.random.random(3), expected)
    assert "nothing to convert" in ckpt.convert_to_safe_format(path)


def test_the_convert_command_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app
    path = tmp_path / "last.pt"
    torch.save({"rng": np.random.get_state(), "step": 1}, path)
    result = CliRunner().invoke(app, ["convert-checkpoint", str(path)])
    assert result.exit_code == 0 and f"converted {path}" in result.output
    assert ckpt.load_checkpoint(path)["step"] == 1
    missing = CliRunner().invoke(app, ["convert-checkpoint", str(tmp_path / "none.pt")])
    assert missing.exit_code == 2 and "is not a file" in missing.output


def _raw_pickle(path: Path, sentinel: Path) -> Path:
    path.write_bytes(pickle.dumps({"state_dict": Planted(sentinel)}, protocol=2))
    return path


def _written(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def _truncated(path: Path, sentinel: Path) -> Path:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(3)}, buffer)
    path.write_bytes(buffer.getvalue()[:200])
    return path


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("make, says", [
    (plant, "_create_sentinel, which mclpipe never stored"),  # torch's zip archive holding a planted pickle
    (_raw_pickle, "is not a checkpoint or model file an earlier mclpipe wrote"),  # a plain pickle stream
    (lambda path, _: _written(path, b""), "EOFError"),  # empty
    (lambda path, _: _written(path, b"not a checkpoint"), "is not a checkpoint or model file"),
    (_truncated, "PytorchStreamReader failed"),  # a copy cut short
])
def test_the_convert_command_refuses_an_unreadable_or_planted_file_in_one_line(tmp_path, sentinel, make, says):
    """Exit 2 and one line (the file, why, the fix) whatever the file holds; a planted pickle never runs (the
    sentinel fixture) and the file is left as it was."""
    from typer.testing import CliRunner

    from flows.cli import app
    path = make(tmp_path / "last.pt", sentinel)
    before = path.read_bytes()
    result = CliRunner().invoke(app, ["convert-checkpoint", str(path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and str(path) in lines[0] and says in lines[0]
    assert "delete it and rerun the step that writes it" in lines[0]
    assert path.read_bytes() == before


def test_what_the_engine_saves_reads_back_without_unpickling_code(tmp_path):
    """Everything a training checkpoint stores (model, optimizer, scheduler, scaler, RNG states of every rank, the
    non-finite guard) is tensors and plain data; a writer that slips anything else in is stopped when it saves."""
    from bench.gpu_check import QuietTask, RegressionRows
    from contrastive.engine.loop import train
    from contrastive.engine.task import LoopSpec, OptimSpec
    train(task=QuietTask(), source=RegressionRows(steps=4, device=torch.device("cpu")),
          optim=OptimSpec(name="adam", lr=0.01, warmup_fraction=0.5),
          loop=LoopSpec(epochs=1, checkpoint_every_steps=2, log_every_steps=100, on_nonfinite="rollback"),
          device=torch.device("cpu"), checkpoint_path=tmp_path / "last.pt")
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "rng_by_rank", "nonfinite"} <= set(state)
    with pytest.raises(TypeError, match=r"\['rng'\]\['numpy'\]"):
        ckpt.save_checkpoint({"rng": {"numpy": np.zeros(3)}}, tmp_path / "bad.pt")
    assert not (tmp_path / "bad.pt").exists()


# ---------------------------------------------------------------------------------------------------- image models
@pytest.fixture(scope="module")
def image_stage(tmp_path_factory):
    """A trained tiny image stage: (dataset dir, stage dir)."""
    from contrastive.modalities.image import steps as stages
    from tests.faults.tiny_data import tiny_trifeature
    from tests.faults.train_tiny_stage import tiny_spec
    root = tmp_path_factory.mktemp("image")
    dataset_dir = tiny_trifeature(root / "data")
    stages.train_stage(tiny_spec(dataset_dir, root / "stage", epochs=1))
    return dataset_dir, root / "stage"


def test_an_image_init_model_that_is_a_planted_pickle_is_refused(tmp_path, sentinel, image_stage):
    from contrastive.modalities.image import steps as stages
    from tests.faults.train_tiny_stage import tiny_spec
    init = plant(tmp_path / "init" / "model.pt", sentinel)
    spec = dataclasses.replace(tiny_spec(image_stage[0], tmp_path / "stage", epochs=1), init_model_path=str(init))
    with pytest.raises(UnsafeFileError) as refused:
        stages.train_stage(spec)
    assert_refused(refused, init)


def test_an_image_stage_model_for_export_and_serving_that_is_a_planted_pickle_is_refused(tmp_path, sentinel,
                                                                                          image_stage):
    from contrastive.modalities.image import serving
    from contrastive.modalities.image import steps as stages
    model = plant(tmp_path / "stage" / "model" / "model.pt", sentinel)
    with pytest.raises(UnsafeFileError) as refused:
        stages.export_stage_embeddings(dataset_dir=image_stage[0], model_path=model, out_dir=tmp_path / "export",
                                       batch_size=16, device="cpu")
    assert_refused(refused, model)
    with pytest.raises(UnsafeFileError) as refused:
        serving.load_encoder(str(model))
    assert_refused(refused, model)
    # the real one, and one written before this change (plain torch.save, no digest), load: the stage's weights
    real = image_stage[1] / "model" / "model.pt"
    saved = torch.load(real, weights_only=True)
    assert_same_weights(stages.load_trained_model(model_path=real, device=torch.device("cpu")).state_dict(),
                        saved["state_dict"])
    torch.save(saved, tmp_path / "old.pt")
    assert_same_weights(stages.load_trained_model(model_path=tmp_path / "old.pt", device=torch.device("cpu"))
                        .state_dict(), saved["state_dict"])


def assert_same_weights(loaded: dict, expected: dict) -> None:
    """The same parameter names and, name by name, equal tensors."""
    assert list(loaded) == list(expected) and expected
    for name, tensor in expected.items():
        assert torch.equal(loaded[name].cpu(), tensor.cpu()), name


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_raw_pickle_in_place_of_a_model_is_refused(tmp_path, sentinel):
    """Not torch's zip archive at all: the legacy format torch.load also reads, a plain pickle stream."""
    from contrastive.modalities.image import steps as stages
    model = tmp_path / "model.pt"
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        model.write_bytes(pickle.dumps({"state_dict": Planted(sentinel)}, protocol=protocol))
        with pytest.raises(UnsafeFileError) as refused:
            stages.load_trained_model(model_path=model, device=torch.device("cpu"))
        assert_refused(refused, model, names_object=protocol == 2)  # torch names no object of a framed pickle


# ---------------------------------------------------------------------------------------------------- text, embeddings
def test_a_text_stage_model_that_is_a_planted_pickle_is_refused(tmp_path, sentinel):
    from contrastive.modalities.text.steps import load_text_model
    model = plant(tmp_path / "model.pt", sentinel, encoder={"kind": "tiny"})
    with pytest.raises(UnsafeFileError) as refused:
        load_text_model(model_path=model, device=torch.device("cpu"))
    assert_refused(refused, model)


@pytest.fixture(scope="module")
def feature_data(tmp_path_factory):
    from contrastive.modalities.embeddings.data import prepare_synthetic
    return prepare_synthetic(root=tmp_path_factory.mktemp("features"), num_train=64, num_test=16, dim=6,
                             classes={"dominant": 2}, scales={"dominant": 3.0}, noise=0.3, seed=0)


def _feature_spec(stage_dir, data_dir, *, init=None):
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.embeddings.steps import FeatureStageSpec
    return FeatureStageSpec(stage_dir=str(stage_dir), seed=5, device="cpu", optim=OptimSpec(lr=3e-3),
                            loop=LoopSpec(epochs=1, log_every_steps=1, checkpoint_every_steps=1000),
                            dataset_dir=str(data_dir), pseudo_labels_path=None, init_model_path=init,
                            encoder={"hidden": 8, "depth": 1, "dim": 4, "projection_dim": 4},
                            views={"temperature": 0.2, "feature_dropout": 0.2, "noise": 0.1}, batch_size=16,
                            remainder_policy="partial")


def test_embeddings_init_and_stage_models_that_are_planted_pickles_are_refused(tmp_path, sentinel, feature_data):
    from contrastive.modalities.embeddings.steps import load_feature_model, train_feature_stage
    init = plant(tmp_path / "init.pt", sentinel)
    with pytest.raises(UnsafeFileError) as refused:
        train_feature_stage(_feature_spec(tmp_path / "stage", feature_data, init=str(init)))
    assert_refused(refused, init)
    with pytest.raises(UnsafeFileError) as refused:
        load_feature_model(model_path=init, device=torch.device("cpu"))
    assert_refused(refused, init)


# ---------------------------------------------------------------------------------------------------- CLIP
def test_clip_stage_models_soup_inputs_serving_files_and_pretrained_weights_that_are_planted_are_refused(
        tmp_path, sentinel):
    from contrastive.modalities.image_text import serving
    from contrastive.modalities.image_text.model import (TINY_MODEL, ClipSpec, create_clip, load_stage_model,
                                                         save_stage_model)
    from contrastive.modalities.image_text.steps import make_soup
    bundle = create_clip(spec=ClipSpec(model_name=TINY_MODEL, trainable_image_blocks=1))
    with torch.no_grad():  # "trained": weights a rebuilt init would not have
        for parameter in bundle.model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter))
    good = save_stage_model(model=bundle.model, spec=bundle.spec, path=tmp_path / "s0" / "model.pt",
                            weights_file=None)
    planted = plant(tmp_path / "s1" / "model.pt", sentinel, key="trainable_state", spec=bundle.spec.to_dict())

    with pytest.raises(UnsafeFileError) as refused:
        load_stage_model(path=planted)
    assert_refused(refused, planted)
    with pytest.raises(UnsafeFileError) as refused:  # a soup's inputs
        make_soup(model_paths=[str(good), str(planted)], out_path=str(tmp_path / "soup.pt"))
    assert_refused(refused, planted)
    with pytest.raises(UnsafeFileError) as refused:  # the registered model's file
        serving.load_encoder(str(planted))
    assert_refused(refused, planted)
    weights = plant(tmp_path / "ViT.pt", sentinel)
    with pytest.raises(UnsafeFileError) as refused:  # model.pretrained: a weights file
        create_clip(spec=ClipSpec(model_name=TINY_MODEL, pretrained=str(weights), trainable_image_blocks=1))
    assert_refused(refused, weights)
    with pytest.raises(Exception, match="weights_only"):
        create_clip(spec=ClipSpec(model_name=TINY_MODEL, extra={"weights_only": False}))

    # the files mclpipe writes load: the soup of [good, good] is good, the serving copy holds good's weights
    original = load_stage_model(path=good).model.state_dict()
    assert_same_weights(original, bundle.model.state_dict())
    soup = make_soup(model_paths=[str(good), str(good)], out_path=str(tmp_path / "soup.pt"))
    assert_same_weights(load_stage_model(path=Path(soup)).model.state_dict(), original)
    served = serving.load_encoder(serving.write_serving_file(str(good), out_dir=tmp_path / "serving"))
    assert_same_weights(served.model.state_dict(), original)


def test_a_file_that_is_not_mclpipe_s_cannot_be_converted(tmp_path, sentinel):
    """The convert command allows only the data types earlier versions stored: it refuses a file whose content is
    no data mclpipe ever stored, and a planted pickle, before anything of it runs (the sentinel fixture)."""
    path = tmp_path / "odd.pt"
    torch.save({"state_dict": torch.nn.Linear(2, 2)}, path)
    with pytest.raises(DataError, match="torch.nn.modules.linear.Linear"):
        ckpt.convert_to_safe_format(path)
    planted = plant(tmp_path / "planted.pt", sentinel)
    with pytest.raises(DataError, match="_create_sentinel"):
        ckpt.convert_to_safe_format(planted)


def test_numpy_scalars_arrays_and_paths_of_earlier_files_convert_to_plain_data(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"mean": np.float32(0.5), "counts": np.arange(3), "dir": Path("/runs/a"), "w": torch.ones(1)}, path)
    assert "converted" in ckpt.convert_to_safe_format(path)
    state = ckpt.load_torch_file(path, what="model")
    assert state["mean"] == 0.5 and torch.equal(state["counts"], torch.arange(3)) and state["dir"] == "/runs/a"


# ---------------------------------------------------------------------------------------------------- datasets
def test_a_planted_cifar_batch_is_refused_and_real_ones_still_read(tmp_path, sentinel):
    """CIFAR-10's python version is a pickle by design: read with an unpickler that rebuilds only numpy arrays
    and plain data."""
    from contrastive.modalities.image.datasets.cifar_mnist import read_cifar10
    from tests.unit.modalities.image.datasets.test_cifar_mnist import write_cifar
    truth = write_cifar(tmp_path)
    images, labels, _ = read_cifar10(tmp_path, split="test")
    np.testing.assert_array_equal(images, truth["test_batch"][0])
    batch = tmp_path / "cifar-10-batches-py" / "test_batch"
    with open(batch, "wb") as handle:
        pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [Planted(sentinel)]}, handle, protocol=2)
    with pytest.raises(UnsafeFileError) as refused:
        read_cifar10(tmp_path, split="test")
    message = str(refused.value)
    assert "\n" not in message and str(batch) in message and "_create_sentinel" in message
    assert "cifar-10-python.tar.gz" in message


# ---------------------------------------------------------------------------------------------------- the helpers
def test_check_plain_names_the_first_entry_that_would_not_load_by_its_place():
    """The writer's check: the message is the role, the entry's place (keys, indexes; a key marked as such), its
    type and the fix."""
    from contrastive.engine.safe_load import check_plain
    fix = (": mclpipe's files hold only tensors and plain data (dicts, lists, numbers, strings), so that they load "
           "without unpickling code; store it as one of those (contrastive.engine.safe_load)")
    check_plain({"a": [1, 2.0, "s", None, torch.ones(1)], 3: (b"x", torch.float32)}, what="checkpoint")
    for value, where in [({"a": [1, np.zeros(2)]}, "['a'][1] is a numpy.ndarray"),
                         ({"a": {Path("k"): 1}}, "['a'][PosixPath('k')] (key) is a pathlib.PosixPath"),
                         ([np.float32(1)], "[0] is a numpy.float32")]:
        with pytest.raises(TypeError) as refused:
            check_plain(value, what="checkpoint")
        assert str(refused.value) == f"checkpoint{where}{fix}"


class _Point(tuple):
    """A tuple subclass (as a namedtuple is): converted to a plain list."""


@dataclasses.dataclass
class _Stats:
    mean: float
    where: Path


def test_plain_copy_turns_what_earlier_versions_stored_into_plain_data():
    from collections import OrderedDict

    from contrastive.engine.safe_load import plain_copy
    counts = np.arange(3)
    copied = plain_copy(counts, what="model")
    counts[0] = 99  # a copy, not a view of the caller's array
    assert torch.equal(copied, torch.arange(3))
    key = plain_copy(np.array([1, 2], dtype=np.uint32), what="model")  # numpy's RNG key: int64 (torch has no uint32)
    assert key.dtype == torch.int64 and key.tolist() == [1, 2]
    assert plain_copy(np.array([0.5]), what="model").dtype == torch.float64
    assert plain_copy(np.array(["a", "bc"]), what="model") == ["a", "bc"]
    assert plain_copy(_Stats(np.float32(0.5), Path("/r")), what="model") == {"mean": 0.5, "where": "/r"}
    assert type(plain_copy({"a": 1}, what="model")) is dict
    assert plain_copy(_Point((1, np.int64(2))), what="model") == [1, 2]
    assert plain_copy((1, [2]), what="model") == (1, [2]) and plain_copy({3}, what="model") == {3}
    state = OrderedDict(w=torch.ones(1))
    state._metadata = {"": {"version": np.int64(2)}}  # a state dict's module versions
    loaded = plain_copy(state, what="model")
    assert type(loaded) is OrderedDict and list(loaded) == ["w"]
    assert loaded._metadata == {"": {"version": 2}} and type(loaded._metadata[""]["version"]) is int


def test_plain_copy_names_what_mclpipe_never_stored_by_its_place():
    from collections import OrderedDict

    from decimal import Decimal

    from contrastive.engine.safe_load import plain_copy
    state = OrderedDict(w=torch.ones(1))
    state._metadata = {"x": object()}
    fix = (", which mclpipe never stores: this file was not written by mclpipe and cannot be converted; delete it "
           "and rerun the step that writes it")
    for value, where in [({"outer": {object(): 1}}, "['outer'] is a builtins.object"),
                         ({"a": [1, Decimal(1)]}, "['a'][1] is a decimal.Decimal"),
                         (np.array([1, object()], dtype=object), "[1] is a builtins.object"),
                         ({"s": state}, "['s']._metadata['x'] is a builtins.object")]:
        with pytest.raises(DataError) as refused:
            plain_copy(value, what="model")
        assert str(refused.value) == f"model{where}{fix}"


def test_load_array_pickle_reads_python_2_strings_and_names_the_global_it_refuses(tmp_path):
    from contrastive.engine.safe_load import load_array_pickle
    # CIFAR-10's batches were pickled by Python 2: its str is SHORT_BINSTRING, decoded with the encoding given
    assert load_array_pickle(io.BytesIO(b"\x80\x02U\x03abcq\x00."), path="b", what="batch", fix="") == "abc"
    with pytest.raises(UnsafeFileError) as refused:
        load_array_pickle(io.BytesIO(b"\x80\x02cos\nsystem\nq\x00."), path="/d/b", what="CIFAR-10 batch", fix="Fix.")
    assert str(refused.value) == ("CIFAR-10 batch /d/b holds a pickled os.system that loading would have to run, so "
                                  "it was not loaded (mclpipe reads only tensors, arrays and plain data). Fix.")


def test_load_torch_file_names_the_path_given_for_a_buffer_and_honours_map_location(tmp_path, sentinel):
    from contrastive.engine.safe_load import load_torch_file, unsafe_file_error
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    buffer.seek(0)
    assert load_torch_file(buffer, what="model", map_location="meta")["w"].device.type == "meta"
    planted = plant(tmp_path / "model.pt", sentinel)
    with pytest.raises(UnsafeFileError) as refused:
        load_torch_file(io.BytesIO(planted.read_bytes()), what="stage model", path="runs/s1/model.pt")
    assert str(refused.value).startswith("stage model runs/s1/model.pt holds a pickled ")
    plain = unsafe_file_error("m.pt", what="model", exc=pickle.UnpicklingError("framed"), fix="F")
    assert str(plain) == ("model m.pt holds pickled Python objects that loading would have to run, so it was not "
                          "loaded (mclpipe reads only tensors, arrays and plain data). F")


def test_a_planted_file_is_refused_even_where_the_user_turned_torch_s_safe_default_off(tmp_path, sentinel,
                                                                                         monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 turns ``torch.load``'s default off, but not an explicit weights_only."""
    from contrastive.engine.safe_load import load_torch_file
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeFileError):
        load_torch_file(plant(tmp_path / "model.pt", sentinel), what="model")
