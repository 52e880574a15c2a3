"""The run policy (pipeline_config/run_policy.py): which keys a deployment's run may change, and where its paths may
point. The flow side (a run started from a deployment under Prefect's test server) is in
tests/flows/test_deployments.py."""
import pytest

from contrastive.errors import ConfigError
from pipeline_config.loader import load_config
from pipeline_config.run_policy import OPERATOR_ONLY, allows, changed_keys, check_overrides


def _check(deployed, run):
    check_overrides(deployed=deployed, run=run, deployment="d")


def test_the_policy_is_outside_every_content_key():
    config = load_config("trifeature_tiny", ["run_policy.overridable=[seed]"])
    assert "run_policy" not in config.content()
    assert config.config_hash() == load_config("trifeature_tiny", []).config_hash()


def test_changed_keys_are_the_leaves_that_differ_or_exist_on_one_side():
    deployed = load_config("trifeature_tiny", [])
    run = load_config("trifeature_tiny", ["train.epochs=3", "stage_overrides.1.train.lr=0.1",
                                          "launcher.kubernetes.node_selector={gpu: a100}"])
    assert changed_keys(deployed=deployed, run=run) == [
        "launcher.kubernetes.node_selector.gpu", "stage_overrides.1.train.lr", "train.epochs"]
    assert changed_keys(deployed=run, run=deployed) == changed_keys(deployed=deployed, run=run)
    assert changed_keys(deployed=deployed, run=deployed) == []


@pytest.mark.parametrize("pattern, key, expected", [
    ("train", "train.epochs", True), ("train.epochs", "train.epochs", True), ("train.epochs", "train", False),
    ("train", "training.epochs", False), ("stage_overrides.*.train.lr", "stage_overrides.2.train.lr", True),
    ("stage_overrides.*.train.lr", "stage_overrides.2.train.epochs", False), ("data.files", "data.files.ids", True),
])
def test_patterns(pattern, key, expected):
    assert allows(pattern, key) is expected


def test_the_deployed_policy_counts_not_the_runs():
    deployed = load_config("trifeature_tiny", [])
    run = load_config("trifeature_tiny", ["run_policy.overridable=[seed, launcher.kind]", "launcher.kind=torchrun"])
    with pytest.raises(ConfigError, match=r"changes launcher.kind \(and run_policy.overridable\), which the "
                                          r"deployment fixes: a run may change only seed, train.epochs"):
        _check(deployed, run)


@pytest.mark.parametrize("key", OPERATOR_ONLY)
def test_no_pattern_may_reach_an_operator_only_key(key):
    with pytest.raises(ConfigError, match=f"would let a run change {key}, which only the operator sets"):
        load_config("trifeature_tiny", [f"run_policy.overridable=[seed, '{key}']"])
    for pattern in {key.split(".")[0], key.rsplit(".", 1)[0] + ".*", "*", "*.*"}:
        with pytest.raises(ConfigError, match="would let a run change .*, which only the operator sets"):
            load_config("trifeature_tiny", [f"run_policy.overridable=['{pattern}']"])


def test_paths_must_resolve_under_a_root(tmp_path, monkeypatch):
    """Relative paths and roots resolve against the flow's directory; '..' and symlinks are followed first."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "mine").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (tmp_path / "data" / "link").symlink_to(tmp_path / "secret")
    deployed = load_config("trifeature_tiny", [])
    for inside in ("data/mine", "data", str(tmp_path / "data" / "new"), "data/mine/../other"):
        _check(deployed, load_config("trifeature_tiny", [f"data.cache_dir={inside}"]))
    for outside in ("data/../secret", "data/link", "data/link/x", "/etc", "datasets", "data2"):
        with pytest.raises(ConfigError, match=f"sets data.cache_dir='{outside}', which resolves to .*, outside the "
                                              "allowed roots"):
            _check(deployed, load_config("trifeature_tiny", [f"data.cache_dir={outside}"]))


def test_the_operator_names_the_roots(tmp_path):
    deployed = load_config("trifeature_tiny", [f"run_policy.path_roots=['{tmp_path}/shared']"])
    _check(deployed, load_config("trifeature_tiny", [f"run_policy.path_roots=['{tmp_path}/shared']",
                                                     f"data.cache_dir={tmp_path}/shared/x"]))
    with pytest.raises(ConfigError, match="outside the allowed roots"):
        _check(deployed, load_config("trifeature_tiny", [f"run_policy.path_roots=['{tmp_path}/shared']",
                                                         "data.cache_dir=data/x"]))
