"""VICReg and Barlow Twins (losses, methods, MCL stages) and their HEX local term, against hand-written loops."""
import numpy as np
import pytest
import torch

from contrastive.methods.dimension_losses import (barlow_twins_loss, local_offdiagonal_penalty, off_diagonal, standardise,
                                          vicreg_loss)
from contrastive.errors import ConfigError
from contrastive.methods.hex import EpsilonRule, HexRule, OnlineClusterSettings, QRule
from contrastive.methods import build_method
from contrastive.methods.barlow import BarlowSettings, BarlowTwins
from contrastive.methods.vicreg import VICReg, VicregSettings
from tests.unit.modalities.image.training import MODEL, train_on_images


def pair(batch=7, dim=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, dim, generator=gen, dtype=torch.float64), torch.randn(batch, dim, generator=gen,
                                                                                    dtype=torch.float64)


def covariance_loop(x, y, *, unbiased):
    """C_kl = sum_n (x_nk - xbar_k)(y_nl - ybar_l) / (n - u), entry by entry."""
    n, d = x.shape
    xbar = [sum(x[i, k] for i in range(n)) / n for k in range(d)]
    ybar = [sum(y[i, k] for i in range(n)) / n for k in range(d)]
    return [[sum((x[i, k] - xbar[k]) * (y[i, l] - ybar[l]) for i in range(n)) / (n - (1 if unbiased else 0))
             for l in range(d)] for k in range(d)]


def test_vicreg_loss_matches_the_paper_term_by_term():
    z1, z2 = pair()
    n, d = z1.shape
    loss, stats = vicreg_loss(z1=z1, z2=z2, sim_coeff=25.0, std_coeff=25.0, cov_coeff=1.0)
    invariance = sum(float((z1[i, k] - z2[i, k]) ** 2) for i in range(n) for k in range(d)) / (n * d)
    variance = covariance = 0.0
    for z in (z1, z2):
        c = covariance_loop(z, z, unbiased=True)
        variance += sum(max(0.0, 1.0 - float(np.sqrt(float(c[k][k]) + 1e-4))) for k in range(d)) / d / 2
        covariance += sum(float(c[k][l]) ** 2 for k in range(d) for l in range(d) if k != l) / d
    assert np.isclose(loss.item(), 25 * invariance + 25 * variance + covariance, rtol=1e-9)
    assert np.isclose(stats["vicreg/covariance"], covariance) and np.isclose(stats["vicreg/variance"], variance)


def test_barlow_twins_loss_matches_the_paper_term_by_term():
    z1, z2 = pair(seed=1)
    n, d = z1.shape
    a, b = standardise(z1), standardise(z2)
    for k in range(d):  # standardised: mean 0, biased variance 1 (up to eps)
        assert abs(a[:, k].mean()) < 1e-9 and abs((a[:, k] ** 2).mean() - 1) < 1e-4
    c = [[sum(float(a[i, k] * b[i, l]) for i in range(n)) / n for l in range(d)] for k in range(d)]
    expected = sum((1 - c[k][k]) ** 2 for k in range(d)) + 0.01 * sum(
        c[k][l] ** 2 for k in range(d) for l in range(d) if k != l)
    loss, _ = barlow_twins_loss(z1=z1, z2=z2, lambd=0.01)
    assert np.isclose(loss.item(), expected, rtol=1e-9)
    # identical views whose dimensions are centred, unit-variance and orthogonal (Hadamard columns): C = I, the
    # minimum 0 (up to the standardisation's eps)
    hadamard = torch.tensor([[1, 1, 1], [-1, 1, -1], [1, -1, -1], [-1, -1, 1]], dtype=torch.float64)
    assert barlow_twins_loss(z1=hadamard, z2=hadamard, lambd=0.01)[0].item() < 1e-8


@pytest.mark.parametrize("unbiased", [True, False])
def test_local_penalty_matches_a_per_anchor_covariance_loop(unbiased):
    a, b = pair(batch=6, dim=3, seed=2)
    members = torch.rand(6, 6, generator=torch.Generator().manual_seed(3)) > 0.5
    members |= torch.eye(6, dtype=torch.bool)
    members[0] = False
    members[0, 0] = True  # |S_0| = 1: no covariance, penalty 0
    got = local_offdiagonal_penalty(a=a, b=b, members=members, unbiased=unbiased)
    small_chunks = local_offdiagonal_penalty(a=a, b=b, members=members, unbiased=unbiased, chunk_elements=40)
    for i in range(6):
        rows = members[i].nonzero().flatten()
        if len(rows) < 2:
            assert got[i].item() == 0.0
            continue
        c = covariance_loop(a[rows], b[rows], unbiased=unbiased)
        expected = sum(float(c[k][l]) ** 2 for k in range(3) for l in range(3) if k != l)
        assert np.isclose(got[i].item(), expected, rtol=1e-8), i
    assert torch.allclose(got, small_chunks)


def test_local_penalty_over_the_whole_batch_is_the_global_covariance_term():
    z, _ = pair(batch=9, dim=5, seed=4)
    whole = local_offdiagonal_penalty(a=z, b=z, members=torch.ones(9, 9, dtype=torch.bool), unbiased=True)
    centred = z - z.mean(0)
    expected = off_diagonal(centred.T @ centred / 8).pow(2).sum()
    assert torch.allclose(whole, expected.expand(9))


def identity_method(cls, hex_rule, **settings):
    return cls(backbone=torch.nn.Identity(), head=torch.nn.Identity(), dim=4, hex_rule=hex_rule, **settings)


def test_vicreg_hex_adds_q_times_the_mean_local_covariance_term():
    v1, v2 = (x.float() for x in pair(batch=8, dim=4, seed=5))
    plain = identity_method(VICReg, None)
    rule = HexRule(epsilon=EpsilonRule(mode="fixed", value=0.2), q=QRule(value=0.5))
    hexed = identity_method(VICReg, rule)
    base, _ = plain.training_loss(v1, v2, step=0)
    loss, stats = hexed.training_loss(v1, v2, step=0)
    # H(i): the other samples whose first-view cosine exceeds 0.2, by hand
    unit = torch.nn.functional.normalize(v1, dim=1)
    expected_local = 0.0
    for i in range(8):
        rows = [i] + [n for n in range(8) if n != i and float(unit[i] @ unit[n]) > 0.2]
        for z in (v1, v2):
            if len(rows) >= 2:
                c = covariance_loop(z[rows].double(), z[rows].double(), unbiased=True)
                expected_local += sum(float(c[k][l]) ** 2 for k in range(4) for l in range(4) if k != l) / 4
    expected_local /= 8
    assert np.isclose(loss.item(), base.item() + 1.0 * 0.5 * expected_local, rtol=1e-5)
    assert np.isclose(stats["hex/local_term"], expected_local, rtol=1e-5) and stats["hex/mean_hierarchy_size"] > 0
    zero_q = identity_method(VICReg, HexRule(epsilon=EpsilonRule(mode="fixed", value=0.2), q=QRule(value=0.0)))
    assert torch.allclose(zero_q.training_loss(v1, v2, step=0)[0], base)


def test_barlow_hex_term_and_its_gradient():
    v1, v2 = (x.float().requires_grad_(True) for x in pair(batch=8, dim=4, seed=6))
    rule = HexRule(epsilon=EpsilonRule(mode="fixed", value=0.0), q=QRule(value=2.0))
    method = identity_method(BarlowTwins, rule, settings=BarlowSettings(lambd=0.1))
    loss, stats = method.training_loss(v1, v2, step=0)
    base, _ = barlow_twins_loss(z1=v1, z2=v2, lambd=0.1)
    assert np.isclose(loss.item(), base.item() + 0.1 * 2.0 * stats["hex/local_term"], rtol=1e-5)
    assert stats["hex/local_term"] > 0
    loss.backward()
    assert torch.isfinite(v1.grad).all() and v1.grad.abs().sum() > 0


def test_dimension_methods_refuse_per_pair_q_and_the_hard_negative_weighting():
    from contrastive.modalities.image.config import MethodConfig
    with pytest.raises(ConfigError, match="does not apply to vicreg .* which vicreg has not.*weighting=q"):
        identity_method(VICReg, HexRule(weighting="hard_negative"))
    with pytest.raises(ConfigError, match="but barlow_twins's HEX term .*constant or schedule"):
        identity_method(BarlowTwins, HexRule(q=QRule(mode="similarity")))
    with pytest.raises(ValueError, match="weighting=q"):
        MethodConfig(name="vicreg", hex={"enabled": True, "weighting": "hard_negative"})
    assert MethodConfig(name="vicreg").in_use() == {"name": "vicreg", "temperature": 0.2,
                                                    "vicreg": {"sim_coeff": 25.0, "std_coeff": 25.0,
                                                               "cov_coeff": 1.0, "gamma": 1.0}}


@pytest.mark.parametrize("name", ["vicreg", "barlow_twins"])
def test_trains_as_an_mcl_stage_with_online_cluster_hex_and_resumes(tmp_path, name):
    """Cluster-pure batches (an MCL stage >= 1), HEX from the stage's online clusters, killed and resumed."""
    images = torch.randint(0, 255, (32, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    groups = np.repeat(np.arange(2), 16)
    kwargs = {"name": name, "temperature": 0.2,
              "hex": {"enabled": True, "hierarchy": "online_clusters", "online": {"k": 2}}}
    full_model, full = train_on_images(checkpoint_dir=tmp_path / "full", method_kwargs=kwargs, images=images,
                                       plan_groups=groups, hex_groups=groups)
    assert np.isfinite(full.final_loss) and full.history[-1]["hex/from_groups"] == 1.0
    assert 0 < full.history[-1]["hex/mean_hierarchy_size"] < 7  # a strict subset of the 7 other samples
    train_on_images(checkpoint_dir=tmp_path / "crash", method_kwargs=kwargs, images=images, plan_groups=groups,
                    hex_groups=groups, stop_after_steps=3)
    resumed_model, resumed = train_on_images(checkpoint_dir=tmp_path / "crash", method_kwargs=kwargs,
                                             images=images, plan_groups=groups, hex_groups=groups)
    assert resumed.resumed_from_step == 3
    for key, value in full_model.state_dict().items():
        assert torch.allclose(value.float(), resumed_model.state_dict()[key].float(), atol=1e-4), key
    plain = build_method(model_kwargs=MODEL, method_kwargs={"name": name, "temperature": 0.2})
    assert not plain.wants_groups and plain.hex_rule is None


def test_the_dimension_losses_log_their_terms_by_name_and_a_constant_dimension_standardises_to_0():
    z1, z2 = pair()
    _, vicreg_terms = vicreg_loss(z1=z1, z2=z2, sim_coeff=25.0, std_coeff=25.0, cov_coeff=1.0)
    assert set(vicreg_terms) == {"vicreg/invariance", "vicreg/variance", "vicreg/covariance"}
    _, barlow_terms = barlow_twins_loss(z1=z1, z2=z2, lambd=0.005)
    assert set(barlow_terms) == {"barlow/on_diagonal", "barlow/off_diagonal"}
    constant = torch.ones(5, 2)
    constant[:, 1] = torch.arange(5.0)
    out = standardise(constant)
    assert torch.equal(out[:, 0], torch.zeros(5)) and torch.isfinite(out).all()


def test_a_batch_without_groups_gathers_only_the_projections(monkeypatch):
    """Two ranks stood for by a gather that concatenates: the real one, under a process group, reads ``x.shape``,
    so a gather of the absent groups would fail there (without a process group it is the identity, None included)."""
    from contrastive.methods import dimension_hex
    gathered = []

    def two_ranks(x):
        gathered.append(tuple(x.shape))
        return torch.cat([x, x])
    monkeypatch.setattr(dimension_hex, "gather_with_grad", two_ranks)
    v1, v2 = (x.float() for x in pair(batch=8, dim=4, seed=5))
    method = identity_method(VICReg, HexRule(epsilon=EpsilonRule(mode="fixed", value=0.2), q=QRule(value=0.5)))
    loss, stats = method.training_loss(v1, v2, step=0)
    assert gathered == [(8, 4), (8, 4)] and bool(torch.isfinite(loss)) and stats["hex/local_term"] >= 0


def test_local_penalty_of_bfloat16_features_is_computed_and_returned_in_float32():
    """bf16 features reach the centring in float32 (the function is @fp32_logits): the penalty equals the float32
    penalty of the same bf16 values, in float32. Offset features make the case where bf16 arithmetic would lose the
    centring (checked: without the decorator the penalties come out in bf16, negative)."""
    a, b = pair(batch=8, dim=4, seed=5)
    a16, b16 = (a + 40).to(torch.bfloat16), (b - 40).to(torch.bfloat16)
    members = torch.ones(3, 8, dtype=torch.bool)
    members[1, :3] = False
    members[2, 5:] = False
    got = local_offdiagonal_penalty(a=a16, b=b16, members=members, unbiased=True)
    expected = local_offdiagonal_penalty(a=a16.float(), b=b16.float(), members=members, unbiased=True)
    assert got.dtype == torch.float32
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-7), (got, expected)
