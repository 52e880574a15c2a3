"""`pipeline: clip` configs: presets, the paper's settings, and checks that name the fix."""
import pytest

from contrastive.errors import ConfigError
from pipeline_config.loader import load_config
from contrastive.modalities.image_text.config import ClipPipelineConfig, check_clip_feasible, check_clip_pretrained


def test_presets_load_with_the_papers_settings():
    tiny = load_config("clip_tiny")
    assert isinstance(tiny, ClipPipelineConfig) and tiny.model.name == "mclpipe-tiny-vit"
    check_clip_feasible(tiny, num_train=tiny.data.synthetic.num_train)
    paper = load_config("clip_cc12m_vitl14")
    assert (paper.mcl.num_stages, paper.mcl.clusters, paper.train.global_batch_size) == (4, 10, 8192)
    assert (paper.train.warmup_fraction, paper.model.trainable_image_blocks, paper.train.epochs) == (0.1, 6, 20)
    assert paper.model.lock_text and paper.model.name == "ViT-L-14-quickgelu"
    check_clip_feasible(paper, num_train=10_000_000)  # 10^3 groups <= 10M / 8192
    with pytest.raises(ConfigError, match="--set model.pretrained="):
        check_clip_pretrained(paper)
    check_clip_pretrained(load_config("clip_cc12m_vitl14", ["model.pretrained=/models/w.safetensors"]))


@pytest.mark.parametrize("override, fix", [
    ("train.global_batch_sze=8", "unknown key"),
    ("distributed.nproc_per_node=3", "must split into"),
    ("mcl.clusters=[4]", "one K per stage"),
    ("mcl.remainder_policy=pool", "mcl.remainder_policy"),
    ("train.precision=fp8", "train.precision"),
    ("distributed.data_slots=3", "multiple of the 1 processes|data_slots=3 equal"),
])
def test_bad_clip_configs_name_the_fix(override, fix):
    with pytest.raises(ConfigError, match=fix):
        load_config("clip_tiny", ["mcl.num_stages=3", override])


def test_capacity_rule_uses_the_global_batch():
    config = load_config("clip_tiny", ["mcl.num_stages=3", "mcl.clusters=4", "train.global_batch_size=32"])
    with pytest.raises(ConfigError, match="prod\\(K\\) <= M/b.*train.global_batch_size"):
        check_clip_feasible(config, num_train=400)  # 16 groups > 400 / 32
    assert config.config_hash() == load_config("clip_tiny", ["mcl.num_stages=3", "mcl.clusters=4",
                                                             "name=other", "output_dir=/tmp/x"]).config_hash()


def test_data_slots_enter_the_keys_only_when_set():
    from contrastive.modalities.image_text.modality import MODALITY as CLIP
    data = {"digest": "d"}
    plain, slotted = load_config("clip_tiny"), load_config("clip_tiny", ["distributed.data_slots=2"])
    assert plain.distributed.slots() == 1 and slotted.distributed.slots() == 2
    assert "data_slots" not in plain.distributed.content() and plain.config_hash() != slotted.config_hash()
    assert CLIP.train_content(plain, stage=0, seed=0, data=data, batches_key=None, inherit_key=None) != \
        CLIP.train_content(slotted, stage=0, seed=0, data=data, batches_key=None, inherit_key=None)
    with pytest.raises(ConfigError, match="multiple of the 2 processes"):
        load_config("clip_tiny", ["distributed.nproc_per_node=2", "distributed.data_slots=3"])
