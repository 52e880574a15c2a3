"""The text pipeline's config: presets load through the one loader, mistakes end in messages that name the fix."""
import pytest

from contrastive.errors import ConfigError
from pipeline_config.loader import config_from_dict, load_config
from contrastive.modalities.text.config import TextPipelineConfig, check_text_feasible, preflight_text


def test_presets_load_as_text_configs():
    for name in ("text_tiny", "text_mcl"):
        config = load_config(name)
        assert isinstance(config, TextPipelineConfig) and config.pipeline == "text"
        preflight_text(config)
    spec = load_config("text_tiny").encoder_spec()
    assert (spec.kind, spec.dim, spec.pooling) == ("tiny", 32, "mean")


@pytest.mark.parametrize("raw, message", [
    ({"pipeline": "text", "model": {"dim": 10, "heads": 3}}, "multiple of model.heads"),
    ({"pipeline": "text", "distributed": {"nproc_per_node": 3}}, "multiple of the 3 processes"),
    ({"pipeline": "text", "data": {"kind": "files"}}, "data.files.sentences"),
    ({"pipeline": "text", "model": {"encoder": "hf"}}, "hf_path"),
    ({"pipeline": "text", "method": {"nam": "x"}}, "method.nam: unknown key"),
    ({"pipeline": "txt"}, "is not a pipeline kind; use one of image, clip, text, embeddings"),
])
def test_mistakes_name_the_fix(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_unused_data_section_is_not_in_the_hash():
    a = config_from_dict({"pipeline": "text"})
    b = config_from_dict({"pipeline": "text", "data": {"files": {"test_fraction": 0.5}}})
    assert a.config_hash() == b.config_hash()
    c = config_from_dict({"pipeline": "text", "data": {"generator": {"num_train": 100}}})
    assert c.config_hash() != a.config_hash()
    renamed = config_from_dict({"pipeline": "text", "name": "other", "train": {"threads": 1}})
    assert renamed.config_hash() == a.config_hash()


def test_preflight_checks_files_and_capacity(tmp_path):
    config = config_from_dict({"pipeline": "text", "data": {"kind": "files",
                                                            "files": {"sentences": str(tmp_path / "none.txt")}}})
    with pytest.raises(ConfigError, match="data.files.sentences .* does not exist"):
        preflight_text(config)
    config = config_from_dict({"pipeline": "text", "mcl": {"num_stages": 3, "clusters": [16, 16]},
                               "train": {"batch_size": 64}})
    with pytest.raises(ConfigError, match="prod\\(K\\) <= M/b"):
        check_text_feasible(config, num_train=2000)
    sup = config_from_dict({"pipeline": "text", "method": {"name": "simcse_sup"},
                            "data": {"kind": "files", "files": {"sentences": str(tmp_path / "s.txt")}}})
    (tmp_path / "s.txt").write_text("a sentence\n")
    with pytest.raises(ConfigError, match="data.files.nli"):
        preflight_text(sup)


def test_two_processes_split_the_global_batch():
    """Text stages run under DDP like the others: two processes are a valid config, and a train key that names
    them (a single process's key is what it was)."""
    from contrastive.modalities.text.modality import MODALITY
    one = config_from_dict({"pipeline": "text"})
    two = config_from_dict({"pipeline": "text", "distributed": {"nproc_per_node": 2}})
    data = {"digest": "d"}
    keys = [MODALITY.train_content(c, stage=0, seed=0, data=data, batches_key=None, inherit_key=None)
            for c in (one, two)]
    assert "processes" not in keys[0] and keys[1]["processes"] == 2
    assert MODALITY.launch.train_entry and MODALITY.launch.export_entry
