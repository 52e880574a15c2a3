"""AMDIM / YADIM: the clipped, penalised NCE against a hand-written loop; the map comparisons each extraction
strategy makes; patches as extra locations; the encoder's maps and their limited receptive fields."""
import math

import pytest
import torch

from contrastive.errors import ConfigError
from contrastive.methods.amdim import AmdimSettings, FeatureMapNCE, amdim_nce, view_maps
from contrastive.methods.parts import MethodParts, resolve_parts
from contrastive.models.amdim_encoder import AmdimEncoder


def loop_nce(anchors, targets, *, tclip, penalty):
    """The NCE of framework paper eq. 1 with AMDIM's clipping and penalty, one score at a time."""
    batch, la, dim = anchors.shape
    lt = targets.shape[1]

    def score(i, a, j, t):
        return sum(float(anchors[i, a, d]) * float(targets[j, t, d]) for d in range(dim)) / math.sqrt(dim)

    raw = {(i, a, j, t): score(i, a, j, t) for i in range(batch) for a in range(la) for j in range(batch)
           for t in range(lt)}
    clip = {key: tclip * math.tanh(value / tclip) for key, value in raw.items()}
    losses = []
    for i in range(batch):
        for a in range(la):
            negatives = sum(math.exp(clip[i, a, j, t]) for j in range(batch) if j != i for t in range(lt))
            for t in range(lt):
                positive = math.exp(clip[i, a, i, t])
                losses.append(-math.log(positive / (positive + negatives)))
    return sum(losses) / len(losses), penalty * sum(v * v for v in raw.values()) / len(raw)


def test_nce_matches_a_hand_written_loop():
    torch.manual_seed(0)
    anchors, targets = 2.0 * torch.randn(3, 2, 4), 2.0 * torch.randn(3, 3, 4)
    nce, penalty = amdim_nce(anchors, targets, tclip=1.5, score_penalty=0.05)  # tclip small: clipping matters
    expected_nce, expected_penalty = loop_nce(anchors, targets, tclip=1.5, penalty=0.05)
    assert nce.item() == pytest.approx(expected_nce, rel=1e-5)
    assert penalty.item() == pytest.approx(expected_penalty, rel=1e-5)
    unclipped, _ = amdim_nce(anchors, targets, tclip=1e6, score_penalty=0.0)
    assert unclipped.item() == pytest.approx(loop_nce(anchors, targets, tclip=1e6, penalty=0.0)[0], rel=1e-5)
    assert unclipped.item() != pytest.approx(nce.item(), rel=1e-3)


def _method(extraction, *, patches=None, image_size=16):
    torch.manual_seed(0)
    encoder = AmdimEncoder(image_size=image_size, width=4, rkhs_dim=6)
    parts = resolve_parts(name="amdim", parts={"extraction": extraction})
    return FeatureMapNCE(backbone=encoder, parts=parts, settings=AmdimSettings(tclip=20.0, score_penalty=0.05),
                         patches=patches)


@pytest.mark.parametrize("extraction, pairs", [("multiscale", [(1, 5), (1, 7), (5, 5)]), ("last", [(1, 1)]),
                                               ("same_level", [(1, 1), (5, 5), (7, 7)])])
def test_each_extraction_compares_the_papers_maps(extraction, pairs):
    method = _method(extraction)
    view1, view2 = torch.rand(3, 3, 16, 16), torch.rand(3, 3, 16, 16)
    loss, stats = method.training_loss(view1, view2, step=0)
    maps = method.backbone.feature_maps(torch.cat([view1, view2]))  # same batch: same batch-norm statistics
    sets = {s: m.flatten(2).transpose(1, 2) for s, m in maps.items()}
    a = {s: v[:3] for s, v in sets.items()}
    b = {s: v[3:] for s, v in sets.items()}
    terms = [amdim_nce(x[j], y[k], tclip=20.0, score_penalty=0.05) for j, k in pairs for x, y in ((a, b), (b, a))]
    expected = sum(n + p for n, p in terms) / len(terms)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert stats["amdim/nce"] == pytest.approx(sum(n.item() for n, _ in terms) / len(terms), rel=1e-5)


def test_last_random_draws_a_map_per_step_reproducibly():
    method = _method("last_random")
    drawn = [method.comparisons(step) for step in range(30)]
    assert drawn == [method.comparisons(step) for step in range(30)]  # a resumed run draws the same maps
    assert {pair for (pair,) in drawn} == {(1, 1), (1, 5), (1, 7)}


def test_patches_add_their_locations_and_are_encoded_one_by_one():
    torch.manual_seed(0)
    encoder = AmdimEncoder(image_size=16, width=4, rkhs_dim=6).eval()  # eval: per-patch batch norm identical
    images = torch.rand(2, 3, 32, 32)
    maps = view_maps(encoder, images, patches=(16, 8), scales=(1, 5))
    assert maps[1].shape == (2, 9, 6) and maps[5].shape == (2, 9 * 25, 6)  # 3 x 3 patches
    for row in range(3):
        for col in range(3):
            patch = images[:, :, 8 * row:8 * row + 16, 8 * col:8 * col + 16]
            own = encoder.feature_maps(patch)
            assert torch.allclose(maps[1][:, 3 * row + col], own[1].flatten(1), atol=1e-5)
            first = (3 * row + col) * 25
            assert torch.allclose(maps[5][:, first:first + 25], own[5].flatten(2).transpose(1, 2), atol=1e-5)


def test_encoder_maps_have_bounded_receptive_fields():
    torch.manual_seed(0)
    encoder = AmdimEncoder(image_size=32, width=4, rkhs_dim=6).eval()
    images = torch.rand(1, 3, 32, 32)
    changed = images.clone()
    changed[:, :, -1, -1] += 1.0  # the bottom-right pixel
    before, after = encoder.feature_maps(images), encoder.feature_maps(changed)
    assert {s: tuple(m.shape) for s, m in before.items()} == {7: (1, 6, 7, 7), 5: (1, 6, 5, 5), 1: (1, 6, 1, 1)}
    moved = (before[7] - after[7]).abs().amax(dim=1)[0]
    assert moved[0, 0] == 0 and moved[-1, -1] > 0  # no padding: the top-left location never sees that pixel
    assert not torch.equal(before[1], after[1])  # the global vector sees the whole image
    assert torch.allclose(encoder(images), before[1].flatten(1))  # forward: the 1x1 map's embedding (B, D)
    with pytest.raises(ConfigError, match="16, 32, 64, 128"):
        AmdimEncoder(image_size=28, width=4, rkhs_dim=6)
    with pytest.raises(ConfigError, match="built for 32 px"):
        encoder.feature_maps(torch.rand(1, 3, 16, 16))


def test_backbone_encoder_only_compares_last_vectors():
    with pytest.raises(ConfigError, match="encoder=amdim"):
        resolve_parts(name="amdim", parts=MethodParts(encoder="backbone"))
    parts = resolve_parts(name="yadim", parts=MethodParts(encoder="backbone"))
    assert parts.extraction == "last" and parts.augmentation == "patches"
