import numpy as np
import pytest
import torch

from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.errors import ConfigError
from contrastive.modalities.text.hyper import (HyperProjection, HyperSpec, Quadruples, conditioned_cosine, conditioned_spearman,
                                    hyper_cl_loss, pair_accuracy, project, quadruple_loss, quadruples_from_pairs,
                                    recall_at_k, train_hyper)
from contrastive.modalities.text.readers import ScoredPair


def test_shapes_and_rank():
    torch.manual_seed(0)
    model = HyperProjection(condition_dim=5, embedding_dim=12, rank=3, hidden=8)
    conditions = torch.randn(4, 5)
    w = model.matrices(conditions)
    assert w.shape == (4, 12, 12)
    assert all(int(torch.linalg.matrix_rank(m)) == 3 for m in w)
    s = torch.randn(4, 12)
    torch.testing.assert_close(model(s, conditions), (w @ s[..., None])[..., 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match="rank"):
        HyperProjection(condition_dim=5, embedding_dim=12, rank=13)


def test_one_embedding_under_two_conditions_gives_two_similarities():
    torch.manual_seed(1)
    model = HyperProjection(condition_dim=2, embedding_dim=6, rank=2)
    s1, s2 = torch.randn(1, 6), torch.randn(1, 6)
    a = conditioned_cosine(model, s1, s2, torch.tensor([[1.0, 0.0]]))
    b = conditioned_cosine(model, s1, s2, torch.tensor([[0.0, 1.0]]))
    assert abs(float((a - b).detach())) > 1e-3


def test_loss_on_a_worked_example():
    # Linear hypernetworks with hand-set weights: condition e1 -> W = diag(1, 0) (keeps x), e2 -> diag(0, 1).
    model = HyperProjection(condition_dim=2, embedding_dim=2, rank=1)
    with torch.no_grad():
        model.h1.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        model.h2.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        model.h1.bias.zero_()
        model.h2.bias.zero_()
    s1, s2 = torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, -1.0]])  # agree on x, opposite on y
    high, low = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    loss, metrics = hyper_cl_loss(model=model, s1=s1, s2=s2, c_high=high, c_low=low, y_high=torch.tensor([1.0]),
                                  y_low=torch.tensor([0.0]), temperature=0.5, mse_weight=2.0)
    # cos under high = 1, under low = -1: L_cl = -log(e^2 / (e^2 + e^-2)); L_mse = ((1-1)^2 + (-1-0)^2) / 2
    expected = -np.log(np.exp(2) / (np.exp(2) + np.exp(-2))) + 2.0 * 0.5
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["hyper/margin"] == pytest.approx(2.0)


def test_recall_at_k_worked_example():
    # Rows on a line: 0 and 1 close (labels a, a), 2 near 1 (label b), 3 far (label b).
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.7, 0.3], [0.0, 1.0]])
    labels = np.array([0, 0, 1, 1])
    # nearest other row: 0 -> 1 (hit), 1 -> 0 (hit), 2 -> 1 (miss), 3 -> 2 (hit)
    assert recall_at_k(x, labels, k=1) == 0.75
    assert recall_at_k(x, labels, k=3) == 1.0
    assert recall_at_k(x, np.array([0, 0, -1, 1]), k=1) == pytest.approx(2 / 3)  # 3's only match is unlabelled


def _toy(num: int, seed: int) -> tuple[Quadruples, np.ndarray]:
    """Sentences = concatenated one-hot attributes (2 attributes x 4 values) plus noise; conditions one-hot.
    A pair shares attribute 0 but not attribute 1, or the reverse; high = the shared one."""
    rng = np.random.default_rng(seed)
    eye = np.eye(2, dtype=np.float32)
    rows = []
    for _ in range(num):
        a = rng.integers(0, 4, size=2)
        b = a.copy()
        shared = rng.integers(0, 2)
        b[1 - shared] = (a[1 - shared] + 1 + rng.integers(0, 3)) % 4
        emb = lambda v: np.concatenate([np.eye(4)[v[0]], np.eye(4)[v[1]]]) + 0.05 * rng.standard_normal(8)  # noqa
        rows.append((emb(a), emb(b), eye[shared], eye[1 - shared], 1.0, 0.0))
    cols = list(zip(*rows))
    return Quadruples(*(np.asarray(c, dtype=np.float32) for c in cols)), eye


def test_training_reduces_the_loss_and_conditions_the_similarity(tmp_path):
    data, _ = _toy(256, seed=0)
    spec = HyperSpec(rank=4, temperature=0.5, mse_weight=1.0, batch_size=32, seed=0)
    torch.manual_seed(spec.seed)
    untrained = HyperProjection(condition_dim=2, embedding_dim=8, rank=4)
    before = quadruple_loss(untrained, data, temperature=0.5, mse_weight=1.0)
    model, summary = train_hyper(data=data, spec=spec, optim=OptimSpec(name="adam", lr=1e-2),
                                 loop=LoopSpec(epochs=15, log_every_steps=8, checkpoint_every_steps=1000),
                                 checkpoint_path=tmp_path / "last.pt", device=torch.device("cpu"))
    after = quadruple_loss(model, data, temperature=0.5, mse_weight=1.0)
    assert after < 0.5 * before
    held_out, _ = _toy(128, seed=1)
    assert pair_accuracy(model, held_out) > 0.9
    assert conditioned_spearman(model, held_out) > conditioned_spearman(None, held_out) + 0.3


def test_quadruples_group_conditions_of_a_pair_and_project_is_one_product():
    pairs = [ScoredPair("a", "b", 5.0, "the place"), ScoredPair("a", "b", 1.0, "the mood"),
             ScoredPair("c", "d", 3.0, "the place")]  # judged once: skipped
    embed = {s: np.full(3, i, np.float32) for i, s in enumerate("abcd")}
    conds = {"the place": np.array([1.0, 0.0]), "the mood": np.array([0.0, 1.0])}
    data, texts = quadruples_from_pairs(pairs, embed=embed, condition_vectors=conds, score_range=(1.0, 5.0))
    assert texts == [("a", "b", "the place", "the mood")]
    assert (data.y_high[0], data.y_low[0]) == (1.0, 0.0)
    np.testing.assert_array_equal(data.c_low[0], [0.0, 1.0])
    model = HyperProjection(condition_dim=2, embedding_dim=3, rank=2)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    expected = model(torch.from_numpy(x), torch.tensor([[1.0, 0.0]]).expand(5, 2)).detach().numpy()
    np.testing.assert_allclose(project(model, x, conds["the place"]), expected, atol=1e-5)
