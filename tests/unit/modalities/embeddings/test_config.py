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


def test_two_processes_split_the_global_batch():
    """Embeddings stages run under DDP like the others: two processes are a valid config, with a train key that
    names them (a single process's key is what it was) and the entry points a launch calls."""
    from contrastive.modalities.embeddings.modality import MODALITY
    from contrastive.engine.launch import resolve_entry
    one = load_config("embeddings_tiny")
    two = load_config("embeddings_tiny", overrides=["distributed.nproc_per_node=2", "launcher.kind=torchrun"])
    keys = [MODALITY.train_content(c, stage=0, seed=0, data={"digest": "d"}, batches_key=None, inherit_key=None)
            for c in (one, two)]
    assert "processes" not in keys[0] and keys[1]["processes"] == 2
    assert callable(resolve_entry(MODALITY.launch.train_entry)) and callable(resolve_entry(MODALITY.launch.export_entry))
