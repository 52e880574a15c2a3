"""The five-part ``method.parts`` section: each method's own parts, the swaps that make sense, clear errors for
those that do not, content keys of existing configs unchanged, and the checks that need the data's image side."""
import pytest
import torch

from contrastive.errors import ConfigError
from contrastive.methods import SimCLR, build_method
from contrastive.methods.amdim import FeatureMapNCE
from contrastive.methods.byol import BYOL
from contrastive.methods.cpc import CPCv2
from contrastive.methods.parts import DEFAULT_PARTS, MethodParts, resolve_parts
from contrastive.models.amdim_encoder import AmdimEncoder
from contrastive.models import SmallCNN
from pipeline_config.loader import config_from_dict
from contrastive.modalities.image.config import MethodConfig

MODEL = dict(encoder="small_cnn", widths=[4, 8], projection_hidden=8, projection_dim=4)
TINY = {"amdim": {"width": 4, "rkhs_dim": 8}}


def test_each_method_has_its_papers_parts():
    assert resolve_parts(name="amdim", parts=None) == MethodParts("views", "amdim", "multiscale", "dot", "nce")
    assert resolve_parts(name="yadim", parts=None) == MethodParts("patches", "amdim", "last", "dot", "nce")
    assert resolve_parts(name="cpc_v2", parts=None) == MethodParts("patches", "amdim", "context", "predicted_dot",
                                                                   "nce")
    assert resolve_parts(name="byol", parts={}).loss == "regression"
    assert set(MethodConfig.model_fields["name"].annotation.__args__) <= set(DEFAULT_PARTS)


@pytest.mark.parametrize("name, parts, swapped", [
    ("yadim", {"extraction": "multiscale"}, MethodParts("patches", "amdim", "multiscale", "dot", "nce")),
    ("yadim", {"augmentation": "views"}, MethodParts("views", "amdim", "last", "dot", "nce")),
    ("amdim", {"extraction": "last"}, MethodParts("views", "amdim", "last", "dot", "nce")),  # the paper's ablation
    ("byol", {"encoder": "amdim"}, MethodParts("views", "amdim", "global", "predicted_cosine", "regression")),
    ("cpc_v2", {"encoder": "backbone"}, MethodParts("patches", "backbone", "context", "predicted_dot", "nce")),
])
def test_one_part_at_a_time(name, parts, swapped):
    assert resolve_parts(name=name, parts=parts) == swapped


@pytest.mark.parametrize("name, parts, message", [
    ("byol", {"loss": "nce"}, r"loss is fixed to regression .* whose loss is nce \(simclr, moco_v2, nnclr, amdim"),
    ("amdim", {"similarity": "cosine"}, "similarity is fixed to dot"),
    ("cpc_v2", {"augmentation": "views"}, "augmentation is fixed to patches"),
    ("amdim", {"extraction": "context"}, "use one of multiscale, last, last_random, same_level"),
    ("amdim", {"encoder": "backbone"}, "set method.parts.encoder=amdim"),
    ("simclr", {"extraction": "multiscale"}, "extraction is fixed to global"),
    ("simclr", {"loss": "hinge"}, "use one of nce, regression"),
    ("amdim", {"similarity": "hinge"}, "similarity 'hinge' is unknown: use one of cosine, predicted_cosine, dot"),
])
def test_combinations_that_make_no_sense_are_rejected_naming_valid_choices(name, parts, message):
    with pytest.raises(ValueError, match=message):  # a pydantic ValidationError carrying the ConfigError's text
        MethodConfig(name=name, parts=parts)
    with pytest.raises(ConfigError, match=message):
        resolve_parts(name=name, parts=parts)


def test_hex_is_rejected_for_the_zoo():
    with pytest.raises(ValueError, match="BYOL has no negatives"):
        MethodConfig(name="byol", hex={"enabled": True})
    with pytest.raises(ValueError, match="use simclr, moco_v2 or nnclr with HEX"):
        MethodConfig(name="amdim", hex={"enabled": True})


def test_content_keys_of_existing_methods_are_unchanged():
    assert MethodConfig().in_use() == {"name": "simclr", "temperature": 0.2}
    assert set(MethodConfig(name="moco_v2").in_use()) == {"name", "temperature", "moco"}
    assert set(MethodConfig(name="nnclr").in_use()) == {"name", "temperature", "nnclr"}
    assert set(MethodConfig(name="byol").in_use()) == {"name", "temperature", "byol"}
    assert set(MethodConfig(name="amdim").in_use()) == {"name", "temperature", "amdim"}
    assert set(MethodConfig(name="yadim").in_use()) == {"name", "temperature", "amdim", "patches"}
    assert set(MethodConfig(name="cpc_v2").in_use()) == {"name", "temperature", "amdim", "cpc", "patches"}
    swapped = MethodConfig(name="simclr", parts={"encoder": "amdim"}).in_use()
    assert swapped["parts"] == {"encoder": "amdim"} and "amdim" in swapped
    assert MethodConfig(byol={"tau_base": 0.9}).in_use() == MethodConfig().in_use()  # unused section: no key change


def test_the_parts_build_the_modules_they_name():
    built = {name: build_method(model_kwargs=MODEL, method_kwargs={"name": name, "temperature": 0.2, **TINY})
             for name in ("byol", "amdim", "yadim", "cpc_v2")}
    assert isinstance(built["byol"], BYOL) and isinstance(built["byol"].backbone, SmallCNN)
    assert isinstance(built["amdim"], FeatureMapNCE) and built["amdim"].patches is None
    assert built["yadim"].patches == (16, 8) and built["yadim"].parts.extraction == "last"
    # only the compared maps get embeddings (DDP requires every parameter to receive a gradient)
    assert built["yadim"].backbone.scales == (1,) and built["amdim"].backbone.scales == (1, 5, 7)
    assert isinstance(built["cpc_v2"], CPCv2) and isinstance(built["cpc_v2"].backbone, AmdimEncoder)
    assert built["cpc_v2"].backbone.image_size == 16  # the amdim encoder takes one patch
    simclr = build_method(model_kwargs=MODEL, method_kwargs={"name": "simclr", "temperature": 0.2,
                                                             "parts": {"encoder": "amdim"}, **TINY})
    assert isinstance(simclr, SimCLR) and isinstance(simclr.backbone, AmdimEncoder)
    assert simclr.head.net[0].in_features == 8  # the head takes the amdim encoder's rkhs_dim
    byol = build_method(model_kwargs=MODEL, method_kwargs={"name": "byol", "temperature": 0.2,
                                                           "parts": {"encoder": "amdim"}, **TINY})
    assert isinstance(byol.target_backbone, AmdimEncoder) and byol.head.net[0].in_features == 8


@pytest.mark.parametrize("config, message", [
    ({"method": {"name": "amdim"}, "data": {"trifeature": {"image_size": 16}}},
     "--set method.amdim.image_size=16"),
    ({"method": {"name": "cpc_v2"}, "data": {"trifeature": {"image_size": 16}}}, "give one row on 16 px images"),
    ({"method": {"name": "yadim", "patches": {"size": 24, "stride": 8}}}, "method.patches.size is 24"),
    ({"method": {"name": "yadim", "patches": {"size": 64, "stride": 8}}}, "larger than the 32 px images"),
    ({"method": {"name": "cpc_v2", "parts": {"encoder": "backbone"}}, "model": {"encoder": "vit_tiny"}},
     "cannot encode patches"),
])
def test_parts_that_do_not_fit_the_images_fail_before_any_compute(config, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(config)


def test_default_zoo_configs_fit_the_default_data():
    for name in ("byol", "amdim", "yadim", "cpc_v2"):
        assert config_from_dict({"method": {"name": name}}).method.name == name


def test_yadim_ablation_rows_and_augmentation_are_valid_configs():
    from contrastive.modalities.image.augment import TwoViewAugment
    from contrastive.methods.yadim import AMDIM_AUGMENT, EXTRACTION_ABLATION, ablation_overrides
    from pipeline_config.loader import apply_overrides

    for method in ("amdim", "yadim"):
        rows = ablation_overrides(method)
        assert len(rows) == len(EXTRACTION_ABLATION) == 4
        for (extraction, _, _), overrides in zip(EXTRACTION_ABLATION.values(), rows.values()):
            config = config_from_dict(apply_overrides({"augment": dict(AMDIM_AUGMENT)}, overrides))
            assert config.method.name == method and config.method.parts.extraction == extraction
            assert config.method.in_use()["parts"] == {"extraction": extraction}
    views = TwoViewAugment(**config.augment.model_dump())(torch.randint(0, 255, (4, 3, 32, 32), dtype=torch.uint8),
                                                          torch.Generator().manual_seed(0))
    assert views[0].shape == (4, 3, 32, 32)


def test_zoo_presets_load_and_are_feasible():
    from contrastive.methods.yadim import AMDIM_AUGMENT
    from pipeline_config.loader import load_config
    from contrastive.modalities.image.config import preflight

    byol = load_config("trifeature_byol")
    yadim = load_config("trifeature_yadim")
    assert byol.method.name == "byol" and yadim.method.name == "yadim"
    preflight(byol)
    preflight(yadim)
    assert {k: v for k, v in yadim.augment.model_dump().items() if k in AMDIM_AUGMENT} == \
        {k: tuple(v) if isinstance(v, tuple) else v for k, v in AMDIM_AUGMENT.items()}
