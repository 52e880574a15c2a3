import math

import torch

from contrastive.modalities.text.encoders import SentenceEncoder, TextEncoderSpec, TinyTransformer
from contrastive.modalities.text.simcse import SimCSE, simcse_sup_loss, simcse_unsup_loss


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _reference_unsup(z1, z2, tau):
    """The isotropy paper's eq. 2, one anchor at a time."""
    total = 0.0
    for i in range(len(z1)):
        logits = [_cos(z1[i], z2[j]) / tau for j in range(len(z2))]
        total += -(logits[i] - math.log(sum(math.exp(v) for v in logits)))
    return total / len(z1)


def _reference_sup(h, hp, hn, tau):
    """SimCSE's supervised objective (its eq. 5), one anchor at a time."""
    total = 0.0
    for i in range(len(h)):
        denominator = sum(math.exp(_cos(h[i], hp[j]) / tau) + math.exp(_cos(h[i], hn[j]) / tau)
                          for j in range(len(h)))
        total += -math.log(math.exp(_cos(h[i], hp[i]) / tau) / denominator)
    return total / len(h)


def test_unsupervised_loss_matches_a_hand_written_loop():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(5, 3, generator=g, dtype=torch.float64)
    for tau in (0.05, 0.5):
        assert math.isclose(simcse_unsup_loss(z1=z1, z2=z2, temperature=tau).item(),
                            _reference_unsup(z1.tolist(), z2.tolist(), tau), rel_tol=1e-9)


def test_supervised_loss_matches_a_hand_written_loop():
    g = torch.Generator().manual_seed(1)
    h, hp, hn = (torch.randn(4, 6, generator=g, dtype=torch.float64) for _ in range(3))
    assert math.isclose(simcse_sup_loss(anchors=h, positives=hp, negatives=hn, temperature=0.05).item(),
                        _reference_sup(h.tolist(), hp.tolist(), hn.tolist(), 0.05), rel_tol=1e-9)


def _model(*, dropout: float, supervised: bool = False) -> SimCSE:
    torch.manual_seed(0)
    spec = TextEncoderSpec(dim=16, depth=1, heads=2, max_length=8, dropout=dropout)
    encoder = SentenceEncoder(transformer=TinyTransformer(vocab_size=20, spec=spec), pooling="mean")
    return SimCSE(encoder=encoder, temperature=0.05, supervised=supervised, mlp_head=True)


def test_dropout_is_the_only_augmentation():
    ids = torch.tensor([[2, 5, 6, 7], [2, 8, 9, 0], [2, 10, 0, 0]])
    mask = (ids != 0).long()
    noisy = _model(dropout=0.3).train()
    _, metrics = noisy.training_loss(ids, mask)
    assert metrics["simcse/positive_cos"] < 0.999  # two dropout masks: the positive pair differs
    clean = _model(dropout=0.0).train()
    loss, metrics = clean.training_loss(ids, mask)
    assert metrics["simcse/positive_cos"] > 0.9999  # no dropout: both views identical
    z = clean.head(clean.encoder(ids, mask))
    assert math.isclose(loss.item(), simcse_unsup_loss(z1=z, z2=z, temperature=0.05).item(), rel_tol=1e-5)


def test_supervised_step_and_embed_ignores_the_head():
    model = _model(dropout=0.0, supervised=True).eval()
    ids = torch.tensor([[2, 5, 6], [2, 8, 9]])
    pos = torch.tensor([[2, 5, 6, 7], [2, 8, 9, 0]])
    neg = torch.tensor([[2, 11], [2, 12]])
    loss, metrics = model.training_loss(ids, (ids != 0).long(), pos, (pos != 0).long(), neg, (neg != 0).long())
    assert loss.item() > 0 and "simcse/hard_negative_cos" in metrics
    torch.testing.assert_close(model.embed(ids, (ids != 0).long()), model.encoder(ids, (ids != 0).long()))
