"""Config of the standard datasets, the baselines and naive inheritance: sections, content keys, checks."""
import pytest

from contrastive.errors import ConfigError
from contrastive.modalities.image.modality import MODALITY as IMAGE
from contrastive.modalities.image import dataset_config as ds
from pipeline_config.loader import load_config, preset_names
from contrastive.modalities.image.config import DataConfig, ImageMclConfig, preflight
from contrastive.settings import digest_of
from tasks import steps as t


def test_new_sections_stay_out_of_existing_content_keys():
    content = DataConfig().content()
    assert not set(ds.KINDS) & set(content)
    assert "inherit" not in ImageMclConfig().content()
    assert ImageMclConfig(inherit=True).content()["inherit"] is True
    chosen = DataConfig(kind="celeba", celeba={"root": "/x"}).content()
    assert chosen["celeba"]["root"] == "/x" and "stl10" not in chosen


def test_method_keys_count_only_the_chosen_baseline():
    plain = load_config("trifeature_tiny", []).method.in_use()
    assert plain == {"name": "simclr", "temperature": plain["temperature"]}
    ifm = load_config("trifeature_tiny", ["method.name=ifm", "method.ifm.epsilon=0.2"]).method.in_use()
    assert ifm["ifm"] == {"epsilon": 0.2, "alpha": 1.0} and "ts" not in ifm and "fd" not in ifm


def test_train_key_changes_only_with_inheritance():
    config = load_config("trifeature_tiny", [])
    data = {"digest": "d"}
    expected = digest_of({"step": "train", "model": config.model.content(), "method": config.method.in_use(),
                          "augment": config.augment.content(), "train": config.train.content(),
                          "seed": t.stage_seed(config, 1), "data": "d", "pseudo_labels": "p",
                          "remainder_policy": config.mcl.remainder_policy, "processes": 1})
    seed = t.stage_seed(config, 1)
    assert digest_of(IMAGE.train_content(config, stage=1, seed=seed, data=data, batches_key="p",
                                         inherit_key=None)) == expected
    assert digest_of(IMAGE.train_content(config, stage=1, seed=seed, data=data, batches_key="p",
                                         inherit_key="k0")) != expected


def test_channels_and_missing_sources_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="model.in_channels=4"):
        load_config("trifeature_tiny", ["data.kind=cifar_mnist"])
    config = load_config("trifeature_tiny", ["data.kind=cifar_mnist", "model.in_channels=4"])
    with pytest.raises(ConfigError, match="--set data.cifar_mnist.cifar_root="):
        preflight(config)
    config = load_config("trifeature_tiny", ["data.kind=stl10", f"data.stl10.root={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigError, match="does not exist.*--set data.stl10.root"):
        preflight(config)
    assert load_config("trifeature_tiny", ["data.kind=stl10"]).data.image_size() == 96


def test_every_paper_preset_loads():
    names = [n for n in preset_names() if n.startswith("paper_")]
    assert len(names) >= 20
    for name in names:
        config = load_config(name, [])
        assert config.name == name
        if name.startswith("paper_table2") and not name.endswith("_mcl"):
            assert config.mcl.num_stages == 1  # baselines run as stage-0-only pipelines
    assert load_config("paper_table5_inheritance", []).mcl.inherit
