"""The embeddings config: defaults validate, mistakes name the fix before any compute."""
import pytest

from contrastive.errors import ConfigError
from pipeline_config.loader import load_config


def test_tiny_preset_is_the_embeddings_pipeline():
    config = load_config("embeddings_tiny")
    assert config.pipeline == "embeddings" and config.mcl.num_stages == 2
    assert "files" not in config.data.content()  # the unused source does not enter the content key


@pytest.mark.parametrize("overrides, message", [
    (["data.kind=files"], "data.files.features is not set"),
    (["data.kind=files", "data.files.features=/nowhere/x.npy"], "data.files.features '/nowhere/x.npy' does not exist"),
    (["train.batch_size=4096"], "larger than the 512 training samples"),
    (["mcl.clusters=64"], "MCL needs prod"),
    (["data.synthetic.scales={a: 1.0}"], "must name the same attributes"),
])
def test_mistakes_name_the_fix(overrides, message):
    from contrastive.modalities.registry import modality_for
    with pytest.raises(ConfigError, match=message):
        modality_for("embeddings").preflight(load_config("embeddings_tiny", overrides=overrides))
