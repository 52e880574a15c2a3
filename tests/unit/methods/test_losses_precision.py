"""Contrastive logits in fp32 under autocast (engine/precision.py ``fp32_logits``): every loss computed inside a
CPU bf16 autocast region equals the fp32 loss (its inputs are fp32: to 1e-6), and from bf16 inputs (a bf16 encoder)
it stays within the inputs' own rounding; without the decorator the same computation is off by far more."""
import pytest
import torch

from contrastive.methods.amdim import amdim_nce
from contrastive.methods.dimension_losses import barlow_twins_loss, local_offdiagonal_penalty, vicreg_loss
from contrastive.methods.losses import cosine_matrix, cross_view_info_nce, hex_info_nce, nt_xent, queue_info_nce
from contrastive.modalities.image_text.loss import clip_loss
from contrastive.modalities.text.simcse import simcse_sup_loss, simcse_unsup_loss

gen = torch.Generator().manual_seed(0)
A, B, C = (torch.randn(64, 32, generator=gen) for _ in range(3))
QUEUE = torch.randn(256, 32, generator=gen)
MEMBERS = torch.rand(8, 64, generator=gen) < 0.5
UNIT = torch.nn.functional.normalize

LOSSES = {
    "nt_xent tau 0.2": lambda a, b, c: nt_xent(z1=a, z2=b, temperature=0.2),
    "HEX tau 0.2": lambda a, b, c: hex_info_nce(z1=a, z2=b, temperature=0.2, epsilon=0.1, q=0.5)[0],
    "NNCLR cross-view": lambda a, b, c: cross_view_info_nce(anchors=a, candidates=b, temperature=0.1),
    "MoCo queue": lambda a, b, c: queue_info_nce(query=a, key=b, queue=QUEUE, temperature=0.2),
    "SimCSE tau 0.05": lambda a, b, c: simcse_unsup_loss(z1=a, z2=b, temperature=0.05),
    "SimCSE supervised": lambda a, b, c: simcse_sup_loss(anchors=a, positives=b, negatives=c, temperature=0.05),
    "CLIP": lambda a, b, c: clip_loss(image_features=UNIT(a, dim=1), text_features=UNIT(b, dim=1),
                                      logit_scale=torch.tensor(100.0)),
    # the dimension-contrastive losses and the similarities that choose HEX's H(i) and NNCLR's neighbours: their
    # matmuls (covariances, Gram matrices, AMDIM's unnormalised scores) in fp32 too
    "AMDIM NCE": lambda a, b, c: amdim_nce(a.view(16, 4, 32), b.view(16, 4, 32), tclip=20.0, score_penalty=0.025)[0],
    "VICReg": lambda a, b, c: vicreg_loss(z1=a, z2=b, sim_coeff=25.0, std_coeff=25.0, cov_coeff=1.0)[0],
    "Barlow Twins": lambda a, b, c: barlow_twins_loss(z1=a, z2=b, lambd=5e-3)[0],
    "HEX local penalty": lambda a, b, c: local_offdiagonal_penalty(a=a, b=b, members=MEMBERS, unbiased=True),
    "cosine matrix": lambda a, b, c: cosine_matrix(a, b),
}


@pytest.mark.parametrize("name", LOSSES)
def test_the_loss_under_bf16_autocast_is_the_fp32_loss(name):
    loss = LOSSES[name]
    reference = loss(A, B, C)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = loss(A, B, C)
        from_bf16_inputs = loss(A.bfloat16(), B.bfloat16(), C.bfloat16())
    assert inside.dtype == torch.float32 and from_bf16_inputs.dtype == torch.float32
    torch.testing.assert_close(inside, reference, rtol=1e-6, atol=1e-6)
    # bf16 inputs carry their rounding (2^-9 relative) into the cosines; the fp32 logits add none of their own
    torch.testing.assert_close(from_bf16_inputs, reference, rtol=2e-2, atol=2e-2)


def test_the_gradient_reaches_bf16_inputs_in_their_dtype():
    a, b = A.bfloat16().requires_grad_(), B.bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nt_xent(z1=a, z2=b, temperature=0.2).backward()
    assert a.grad is not None and a.grad.dtype == torch.bfloat16 and torch.isfinite(a.grad.float()).all()


def test_without_fp32_logits_bf16_autocast_moves_the_simcse_loss():
    """What the decorator prevents: the bf16 matmul of the same fp32 inputs at tau 0.05."""
    reference = simcse_unsup_loss(z1=A, z2=B, temperature=0.05)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        unguarded = simcse_unsup_loss.__wrapped__(z1=A, z2=B, temperature=0.05)
    assert abs(float(unguarded) - float(reference)) > 1e-3
