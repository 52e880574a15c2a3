"""CPC v2: the row-causal context network, the InfoNCE over row predictions against a hand-written loop, and the
patch grid against encoding each patch on its own."""
import math

import pytest
import torch
from torch import nn

from contrastive.errors import ConfigError
from contrastive.methods.cpc import CPCv2, CpcSettings, cpc_info_nce
from contrastive.methods.parts import PatchSettings, cut_patches
from contrastive.models import SmallCNN
from contrastive.models.cpc import ContextNetwork


def test_context_at_a_row_sees_only_that_row_and_the_rows_above():
    torch.manual_seed(0)
    context = ContextNetwork(dim=3, layers=2)
    grid = torch.randn(2, 3, 5, 4)
    for row in range(5):
        changed = grid.clone()
        changed[:, :, row:] += torch.randn_like(changed[:, :, row:])
        before, after = context(grid), context(changed)
        assert torch.equal(before[:, :, :row], after[:, :, :row])  # rows above the change are untouched
        assert not torch.allclose(before[:, :, row:], after[:, :, row:])


def loop_cpc(context, targets, predictors):
    batch, dim, rows, cols = targets.shape
    per_offset = []
    for k in range(1, min(len(predictors), rows - 1) + 1):
        weight = predictors[k - 1].weight[:, :, 0, 0]
        bias = predictors[k - 1].bias
        losses = []
        for b in range(batch):
            for i in range(rows - k):
                for j in range(cols):
                    prediction = [float(sum(weight[o, d] * context[b, d, i, j] for d in range(dim)) + bias[o])
                                  for o in range(dim)]
                    logits = {(b2, i2, j2): sum(prediction[d] * float(targets[b2, d, i2, j2]) for d in range(dim))
                              for b2 in range(batch) for i2 in range(rows) for j2 in range(cols)}
                    normaliser = math.log(sum(math.exp(v) for v in logits.values()))
                    losses.append(normaliser - logits[b, i + k, j])
        per_offset.append(sum(losses) / len(losses))
    return sum(per_offset) / len(per_offset)


def test_info_nce_over_row_predictions_matches_a_loop():
    torch.manual_seed(0)
    context, targets = torch.randn(2, 3, 3, 3), torch.randn(2, 3, 3, 3)
    predictors = nn.ModuleList(nn.Conv2d(3, 3, 1) for _ in range(4))  # 4 offsets asked, 2 fit in 3 rows
    loss = cpc_info_nce(context=context, targets=targets, predictors=predictors)
    with torch.no_grad():
        expected = loop_cpc(context, targets, predictors)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ConfigError, match="at least 2 patch rows"):
        cpc_info_nce(context=context[:, :, :1], targets=targets[:, :, :1], predictors=predictors)


def test_patch_grid_encodes_every_patch_on_its_own():
    torch.manual_seed(0)
    encoder = SmallCNN(widths=[4, 5]).eval()
    method = CPCv2(backbone=encoder, dim=5, settings=CpcSettings(context_layers=1, offsets=2), patches=(8, 4))
    images = torch.rand(2, 3, 16, 16)
    grid = method.patch_grid(images)
    assert grid.shape == (2, 5, 3, 3)
    for row in range(3):
        for col in range(3):
            own = encoder(images[:, :, 4 * row:4 * row + 8, 4 * col:4 * col + 8])
            assert torch.allclose(grid[:, :, row, col], own, atol=1e-6)
    assert method.embed(images).shape == (2, 5)
    loss, _ = method.training_loss(images, images.flip(-1), step=0)
    assert torch.isfinite(loss) and loss.requires_grad


def test_patches_are_cut_row_major_with_overlap():
    images = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6)
    cut = cut_patches(images, size=4, stride=2)
    assert cut.shape == (2, 2, 2, 1, 4, 4)  # (6 - 4) // 2 + 1 = 2 per side; neighbours share 2 columns
    assert torch.equal(cut[0, 0, 1, 0], images[0, 0, 0:4, 2:6]) and torch.equal(cut[0, 1, 0, 0], images[0, 0, 2:6, 0:4])
    cut = cut_patches(images, size=2, stride=2)
    assert cut.shape == (2, 3, 3, 1, 2, 2) and torch.equal(cut[1, 2, 1, 0], images[1, 0, 4:6, 2:4])
    assert PatchSettings(size=64, stride=32).grid(256) == 7  # the paper's 256 px -> 7 x 7 patches
    assert PatchSettings().grid(32) == 3
    with pytest.raises(ConfigError, match="larger than the 8 px"):
        PatchSettings(size=16, stride=8).grid(8)
