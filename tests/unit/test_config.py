import re

import pytest
import yaml

from contrastive.errors import ConfigError
from pipeline_config.loader import config_from_dict, described_config, load_config, parse_override, preset_names
from pipeline_config.schema import config_class
from contrastive.modalities.image.config import ImagePipelineConfig, check_feasible


def test_presets_load_and_default_is_feasible():
    assert {"trifeature_mcl", "trifeature_tiny"} <= set(preset_names())
    config = load_config("trifeature_mcl")
    check_feasible(config, num_train=config.data.trifeature.num_train)


def test_overrides_are_yaml_typed():
    config = load_config("trifeature_tiny", ["train.epochs=3", "mcl.clusters=[8, 2]", "augment.hflip=true"])
    assert config.train.epochs == 3 and config.mcl.clusters == [8, 2] and config.augment.hflip is True
    assert parse_override("a.b=0.5") == (["a", "b"], 0.5)


def test_a_slurm_time_in_a_file_or_an_override_stays_as_written(tmp_path):
    """YAML 1.1 reads ``1:00:00`` as the base-60 int 3600, which Slurm took as 3600 minutes: config files and
    ``--set`` values keep H:M:S and M:S as strings, and every other scalar typed as before."""
    path = tmp_path / "slurm.yaml"
    path.write_text("pipeline: image\nlauncher:\n  kind: slurm\n  slurm: {time_limit: 1:00:00}\n")
    assert load_config(path).launcher.slurm.time_limit == "1:00:00"
    assert load_config("trifeature_tiny", ["launcher.slurm.time_limit=90:00"]).launcher.slurm.time_limit == "90:00"
    assert [parse_override(f"a={v}")[1] for v in ("30", "1.0e-3", "0x10", "[1, 2]", "true")] == [30, 1e-3, 16, [1, 2],
                                                                                               True]


@pytest.mark.parametrize("override, fix", [
    ("train.epoch=3", "unknown key"),
    ("method.temperature=0", "must be > 0"),
    ("mcl.num_stages=0", "num_stages must be >= 1"),
    ("mcl.clusters=[8]", "one K per stage"),
    ("data.kind=image_folder", "data.image_folder.source"),
    ("augment.crop_scale=[0.5, 0.2]", "low <= high"),
    ("train", "key.path=value"),
])
def test_bad_configs_name_the_fix(override, fix):
    with pytest.raises(ConfigError, match=fix):
        load_config("trifeature_tiny", [override])


def test_missing_config_file_lists_presets():
    with pytest.raises(ConfigError, match="trifeature_mcl"):
        load_config("no/such/file.yaml")


@pytest.mark.parametrize("override, suggestion", [
    ("train.epoch=3", "did you mean train.epochs?"),
    ("mcl.num_stage=2", "did you mean mcl.num_stages?"),
    ("data.trifeature.num_trian=10", "did you mean data.trifeature.num_train?"),
])
def test_an_unknown_key_suggests_the_closest_valid_one(override, suggestion):
    with pytest.raises(ConfigError, match=re.escape(suggestion)):
        load_config("trifeature_tiny", [override])


def test_a_misspelt_preset_name_suggests_the_preset():
    with pytest.raises(ConfigError, match="did you mean 'trifeature_mcl'"):
        load_config("trifeature_mlc")


@pytest.mark.parametrize("preset", ["trifeature_mcl", "clip_tiny", "text_tiny"])
def test_described_config_loads_back_to_the_same_config(preset):
    config = load_config(preset, ["seed=3"])
    text = described_config(config)
    assert config_from_dict(yaml.safe_load(text)).config_hash() == config.config_hash()


def test_described_config_marks_changes_and_describes_keys():
    lines = described_config(load_config("trifeature_mcl", ["train.epochs=3"])).splitlines()
    epochs = next(line for line in lines if line.strip().startswith("epochs:") and line.startswith("  e"))
    assert epochs == "  epochs: 3  # [changed; default: 8]"
    device = next(line for line in lines if line.startswith("device:"))
    assert device == "device: auto"  # the default: no mark (and the schema gives it no description)
    storage = next(line for line in lines if line.strip().startswith("storage:"))
    assert "[changed" not in storage and "memory = decode once into images.npy" in storage


def test_cluster_capacity_rule():
    config = ImagePipelineConfig.model_validate({"train": {"batch_size": 100}, "mcl": {"num_stages": 3, "clusters": 10}})
    check_feasible(config, num_train=10_000)  # 10 * 10 = 100 groups <= 10000 / 100
    with pytest.raises(ConfigError, match=r"prod\(K\) <= M/b"):
        check_feasible(config, num_train=9_000)
    with pytest.raises(ConfigError, match="batch_size=100 is larger"):
        check_feasible(config, num_train=50)


def test_config_hash_ignores_name_and_tracking_only():
    a = ImagePipelineConfig()
    assert a.config_hash() == ImagePipelineConfig(name="other", tracking={"experiment": "x"}).config_hash()
    assert a.config_hash() != ImagePipelineConfig(seed=1).config_hash()


def test_kmeans_spec_per_stage_covers_the_kmeans_keywords():
    from contrastive.mcl.clustering import kmeans
    from dataclasses import asdict
    import inspect

    config = load_config("trifeature_tiny", ["mcl.clusters=[8, 3]", "mcl.kmeans_train_points_per_cluster=100",
                                             "mcl.kmeans_init=random"])
    assert asdict(config.mcl.kmeans_spec(1, seed=5)) == {"k": 3, "seed": 5, "niter": config.mcl.kmeans_niter,
                                                        "spherical": True, "init": "random", "max_train_points": 300}
    # placement (where k-means runs), not content: tasks/steps.py kmeans_gpu_devices
    assert set(asdict(config.mcl.kmeans_spec(0, seed=0))) | {"features", "use_gpu", "gpu_devices"} == set(
        inspect.signature(kmeans).parameters)
    every_point = load_config("trifeature_tiny", ["mcl.kmeans_train_points_per_cluster=0"])
    assert every_point.mcl.kmeans_spec(0, seed=0).max_train_points is None
    with pytest.raises(ConfigError, match="kmeans_init"):
        load_config("trifeature_tiny", ["mcl.kmeans_init=kmeans"])


def test_stage_overrides_change_one_stage_and_are_validated():
    config = load_config("trifeature_tiny", ["stage_overrides.2.train.epochs=7", "stage_overrides.2.method.temperature=0.5"])
    assert config.for_stage(2).train.epochs == 7 and config.for_stage(2).method.temperature == 0.5
    assert config.for_stage(2).train.lr == config.train.lr  # only the given keys change
    assert config.for_stage(1) is config and config.for_stage(2).stage_overrides == {}
    assert config.config_hash() != load_config("trifeature_tiny").config_hash()
    # An empty stage_overrides is not part of the hash: configs without overrides hash as if the field did not exist.
    plain = ImagePipelineConfig()
    from pipeline_config.schema import digest_of
    content = plain.content()
    assert content.pop("stage_overrides") == {} and plain.config_hash() == digest_of(content)


def test_fields_that_cannot_change_a_result_stay_out_of_keys_and_hash():
    base = load_config("trifeature_tiny")
    cosmetic = load_config("trifeature_tiny", ["name=renamed", "output_dir=/elsewhere", "train.threads=2",
                                               "train.log_every_steps=3", "train.checkpoint_every_steps=7",
                                               "train.workers=4", "train.channels_last=false",
                                               "tracking.experiment=other"])
    assert cosmetic.config_hash() == base.config_hash() and cosmetic.train.content() == base.train.content()
    for change in ["train.precision=bf16", "train.grad_accumulation=2", "train.lr=0.01", "seed=3"]:
        assert load_config("trifeature_tiny", [change]).config_hash() != base.config_hash(), change
    assert load_config("trifeature_tiny", ["train.grad_accumulation=2"]).train.content() != base.train.content()


@pytest.mark.parametrize("override, fix", [
    ("stage_overrides.5.train.epochs=2", "stages are 0..2"),
    ("stage_overrides.1.mcl.clusters=4", "only the sections model, method, augment, train"),
    ("stage_overrides.1.train.epoch=2", r"stage_overrides.1: train.epoch: Extra inputs"),
    ("stage_overrides.2.train.batch_size=64", "stage 2: MCL needs prod"),  # 4 x 2 groups > 256 / 64
])
def test_bad_stage_overrides_name_the_fix(override, fix):
    config_loader = lambda: load_config("trifeature_tiny", [override])  # noqa: E731
    with pytest.raises(ConfigError, match=fix):
        check_feasible(config_loader(), num_train=config_loader().data.trifeature.num_train)


def test_capacity_rule_checks_a_stage_without_override_between_overridden_ones():
    # Stages 0 and 2 have their own settings, stage 1 keeps the base batch of 128: 4 groups > 256 / 128.
    config = load_config("trifeature_tiny", ["train.batch_size=128", "stage_overrides.0.train.epochs=2",
                                             "stage_overrides.2.train.batch_size=16"])
    with pytest.raises(ConfigError, match="stage 1: MCL needs prod"):
        check_feasible(config, num_train=config.data.trifeature.num_train)


def test_a_vit_must_match_the_image_size_of_the_data():
    with pytest.raises(ConfigError, match="vit_small takes 224 px images but the data are 16 px.*model.image_size=16"):
        load_config("trifeature_tiny", ["model.encoder=vit_small"])
    config = load_config("trifeature_tiny", ["model.encoder=vit_tiny", "model.image_size=16"])
    assert config.data.image_size() == 16


def test_the_image_key_is_image_and_its_old_name_mcl_still_loads_saying_what_to_write(caplog):
    from contrastive.modalities.image import config as image_config
    image_config._say_old_key.cache_clear()
    current = load_config("trifeature_tiny")
    assert current.pipeline == "image" and not caplog.records
    with caplog.at_level("WARNING"):
        old = [config_from_dict({**current.model_dump(mode="json"), "pipeline": "mcl"}) for _ in range(2)]
    assert [type(c) for c in old] == [config_class("image")] * 2 and old[0].pipeline == "image"
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline: mcl is the image pipeline's old name; write pipeline: image"]  # one line, however many configs
    # The pipeline id of an image config is the one it had under the old key (runs made before are found again):
    # trifeature_tiny's as computed before the rename.
    renamed = load_config("trifeature_tiny", ["pipeline=mcl"])
    assert old[0].config_hash() == current.config_hash() == renamed.config_hash() == "4cc586af7caa3c8b"


def test_an_override_of_a_stage_keeps_the_stage_settings_of_the_file():
    """trifeature_quick's stage_overrides has stage 1 (an int key in YAML); --set stage_overrides.1.train.lr adds to
    it instead of replacing it with an entry of its own."""
    config = load_config("trifeature_quick", ["stage_overrides.1.train.lr=0.01"])
    stage1 = config.for_stage(1)
    assert stage1.train.lr == 0.01 and stage1.train.batch_size == 32
    assert config.for_stage(0).train.batch_size == 64 and config.for_stage(0).train.lr == 0.003
