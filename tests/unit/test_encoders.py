"""contrastive/models/encoders.py: every encoder's output shape, the stems, parameter counts against torchvision,
activation checkpointing, and that the first version's configs and saved models build the same modules."""
import pytest
import torch
import torchvision
from torch import nn

from contrastive.errors import ConfigError
from contrastive.models import VIT_PRESETS, build_model
from pipeline_config.loader import load_config
from contrastive.modalities.image.config import ModelConfig

HEAD = {"projection_hidden": 16, "projection_dim": 8}


# --- frozen copy of the first version's encoders (contrastive/models/encoders.py before ResNet-34/50 and ViT) -----
class _OldSmallCNN(nn.Module):
    def __init__(self, *, widths):
        super().__init__()
        layers, in_channels = [], 3
        for i, width in enumerate(widths):
            layers += [nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                       nn.ReLU(inplace=True)]
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
            in_channels = width
        self.features = nn.Sequential(*layers)
        self.out_dim = widths[-1]


def _old_resnet18_cifar():
    net = torchvision.models.resnet18(weights=None)
    net.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


def _assert_same_state(new: nn.Module, old: nn.Module) -> None:
    new_state, old_state = new.state_dict(), old.state_dict()
    assert list(new_state) == list(old_state)
    for key in old_state:
        assert torch.equal(new_state[key], old_state[key]), key


@pytest.mark.parametrize("in_channels", [3, 4])
@pytest.mark.parametrize("encoder, stem, out_dim", [
    ("small_cnn", "cifar", 256), ("resnet18", "cifar", 512), ("resnet18", "imagenet", 512),
    ("resnet34", "cifar", 512), ("resnet34", "imagenet", 512), ("resnet50", "cifar", 2048),
    ("resnet50", "imagenet", 2048), ("vit_tiny", "cifar", 192)])
def test_output_shapes(encoder, stem, out_dim, in_channels):
    model = build_model(**ModelConfig(encoder=encoder, stem=stem, in_channels=in_channels, **HEAD).model_dump())
    images = torch.rand(2, in_channels, 32, 32)
    assert model.backbone.out_dim == out_dim
    assert model.embed(images.clone()).shape == (2, out_dim)
    assert model(images).shape == (2, 8)  # train mode: BN of the head on a batch of 2


@pytest.mark.parametrize("encoder", ["vit_small", "vit_base"])
@pytest.mark.parametrize("in_channels", [3, 4])
def test_large_vit_presets_at_a_small_size(encoder, in_channels):
    # The preset's width and heads at 32 px with 2 blocks: a 16 px patch gives 4 tokens.
    model = build_model(**ModelConfig(encoder=encoder, image_size=32, vit_depth=2, in_channels=in_channels,
                                      **HEAD).model_dump()).eval()
    assert model.embed(torch.rand(2, in_channels, 32, 32)).shape == (2, VIT_PRESETS[encoder].width)
    assert len(model.backbone.encoder.layers) == 2


def test_vit_settings_override_the_preset():
    model = build_model(**ModelConfig(encoder="vit_tiny", image_size=16, vit_patch_size=8, vit_depth=1, vit_width=64,
                                      vit_heads=2, **HEAD).model_dump()).eval()
    vit = model.backbone
    assert vit.out_dim == 64 and vit.seq_length == 1 + 4 and len(vit.encoder.layers) == 1
    assert vit.encoder.layers[0].mlp[0].out_features == 256  # 4 x width when only the width changes
    assert model.embed(torch.rand(3, 3, 16, 16)).shape == (3, 64)


def test_resnet50_parameters_are_torchvisions_without_fc():
    model = build_model(**ModelConfig(encoder="resnet50", stem="imagenet", **HEAD).model_dump())
    reference = torchvision.models.resnet50(weights=None)
    fc = sum(p.numel() for p in reference.fc.parameters())
    assert sum(p.numel() for p in model.backbone.parameters()) == \
        sum(p.numel() for p in reference.parameters()) - fc
    # Same modules and names: torchvision's weights (less fc) load strictly.
    state = {k: v for k, v in reference.state_dict().items() if not k.startswith("fc.")}
    model.backbone.load_state_dict(state, strict=True)


@pytest.mark.parametrize("stem, side", [("cifar", 32), ("imagenet", 8)])
def test_stem_resolution_into_layer1(stem, side):
    backbone = build_model(**ModelConfig(encoder="resnet18", stem=stem, in_channels=4, **HEAD).model_dump()).backbone
    seen = []
    backbone.layer1.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    backbone.eval()(torch.rand(1, 4, 32, 32))
    assert seen == [(1, 64, side, side)]


@pytest.mark.parametrize("encoder", ["resnet18", "resnet50", "vit_tiny"])
def test_grad_checkpointing_gives_the_same_outputs_gradients_and_running_stats(encoder):
    kwargs = ModelConfig(encoder=encoder, **HEAD).model_dump()
    torch.manual_seed(0)
    plain = build_model(**kwargs)
    torch.manual_seed(0)
    checkpointed = build_model(**{**kwargs, "grad_checkpointing": True})
    assert checkpointed.backbone.grad_checkpointing and not plain.backbone.grad_checkpointing
    images = torch.rand(4, 3, 32, 32)
    outs = []
    for model in (plain, checkpointed):
        out = model(images)
        out.square().sum().backward()
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)
    # Recomputation in the backward pass does not update batch-norm running statistics a second time.
    for (name, a), (_, b) in zip(plain.named_buffers(), checkpointed.named_buffers()):
        assert torch.equal(a, b), name


def test_first_versions_models_build_identically():
    # The default config and saved models' model_kwargs (which lack the new keys) build the same modules, and a
    # seeded build gives bitwise the same initial weights as the first version's code.
    default = ModelConfig().model_dump()
    saved_kwargs = {"encoder": "small_cnn", "widths": [32, 64, 128, 256], "projection_hidden": 256,
                    "projection_dim": 128}
    for kwargs in (default, saved_kwargs):
        torch.manual_seed(0)
        new = build_model(**kwargs).backbone
        torch.manual_seed(0)
        _assert_same_state(new, _OldSmallCNN(widths=[32, 64, 128, 256]))
    assert [tuple(p.shape) for p in build_model(**default).backbone.parameters()] == [
        (32, 3, 3, 3), (32,), (32,), (64, 32, 3, 3), (64,), (64,), (128, 64, 3, 3), (128,), (128,),
        (256, 128, 3, 3), (256,), (256,)]
    torch.manual_seed(0)
    new = build_model(**{**saved_kwargs, "encoder": "resnet18"}).backbone
    torch.manual_seed(0)
    _assert_same_state(new, _old_resnet18_cifar())


def test_model_config_content_is_unchanged_by_the_new_defaults():
    assert ModelConfig().content() == {"encoder": "small_cnn", "widths": [32, 64, 128, 256],
                                       "projection_hidden": 256, "projection_dim": 128}
    assert ModelConfig(grad_checkpointing=True).content() == ModelConfig().content()
    assert ModelConfig(in_channels=4).content()["in_channels"] == 4
    assert "stem" in ModelConfig(encoder="resnet50", stem="imagenet").content()


@pytest.mark.parametrize("override, fix", [
    (["model.encoder=vit_tiny", "model.image_size=30"], "multiple of model.vit_patch_size"),
    (["model.encoder=vit_tiny", "model.vit_heads=5"], "choose heads that divide the width"),
    (["model.vit_depth=2"], "set model.encoder to vit_tiny"),
    (["model.encoder=vit_tiny", "model.stem=imagenet"], "set model.encoder to resnet18"),
    (["model.encoder=resnet101"], "model.encoder"),
])
def test_impossible_model_configs_name_the_fix(override, fix):
    with pytest.raises(ConfigError, match=fix):
        load_config("trifeature_tiny", override)
