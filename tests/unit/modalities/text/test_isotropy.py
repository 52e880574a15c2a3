import numpy as np
import pytest

from contrastive.modalities.text.isotropy import (average_random_cosine, frequent_vs_content, intra_sentence_similarity,
                                       isotropy_report, norm_stats, partition_isotropy, self_similarity)


def test_isotropic_gaussian_is_isotropic_and_a_rank_one_cone_is_not():
    rng = np.random.default_rng(0)
    gaussian = rng.standard_normal((20_000, 16))
    assert partition_isotropy(gaussian) > 0.9
    assert abs(average_random_cosine(gaussian)) < 0.02
    direction = rng.standard_normal(16)
    direction /= np.linalg.norm(direction)
    cone = (5.0 + 0.1 * rng.standard_normal(2000))[:, None] * direction  # rank 1, away from the origin
    assert partition_isotropy(cone) < 0.01
    assert average_random_cosine(cone) == pytest.approx(1.0)


def test_partition_isotropy_on_a_worked_example():
    # W = {+e1, -e1, +e2, -e2}: eigenvectors e1, e2; Z = 2 cosh(1) + 2 for both -> I = 1.
    w = np.array([[1.0, 0], [-1, 0], [0, 1], [0, -1]])
    assert partition_isotropy(w) == pytest.approx(1.0)
    # W = {e1, e1, e2}: W^T W = diag(2, 1); Z(e1) = 2e + 1, Z(e2) = e + 2.
    w = np.array([[1.0, 0], [1, 0], [0, 1]])
    assert partition_isotropy(w) == pytest.approx((np.e + 2) / (2 * np.e + 1))


def test_norms():
    x = np.array([[3.0, 4.0], [-3.0, -4.0]])
    assert norm_stats(x) == {"mean_norm": 5.0, "centroid_norm": 0.0}


def test_intra_sentence_similarity_closed_forms():
    k = 4
    orthogonal = np.eye(k)[None]  # one sentence of k orthogonal tokens: cos(e_i, mean) = 1 / sqrt(k)
    mask = np.ones((1, k))
    assert intra_sentence_similarity(orthogonal, mask) == pytest.approx(1 / np.sqrt(k))
    same = np.ones((2, 3, 5))
    assert intra_sentence_similarity(same, np.ones((2, 3))) == pytest.approx(1.0)
    # padding is ignored: a padded orthogonal sentence keeps 1/sqrt(k)
    padded = np.concatenate([orthogonal, np.full((1, 2, k), 9.0)], axis=1)
    assert intra_sentence_similarity(padded, np.array([[1, 1, 1, 1, 0, 0]])) == pytest.approx(1 / np.sqrt(k))


def test_self_similarity_across_sentences():
    # token 7 appears in both sentences with representations at 60 degrees; token 8 only once.
    states = np.zeros((2, 2, 2))
    states[0, 0] = [1, 0]
    states[1, 1] = [0.5, np.sqrt(3) / 2]
    states[0, 1] = [0, 1]
    ids = np.array([[7, 8], [9, 7]])
    sims = self_similarity(states, np.array([[1, 1], [0, 1]]), ids)
    assert sims == {7: pytest.approx(0.5)}
    split = frequent_vs_content({1: 0.9, 2: 0.1, 3: 0.3}, {1: 10, 2: 1, 3: 5}, num_frequent=1)
    assert split == {"self_similarity_frequent": 0.9, "self_similarity_content": pytest.approx(0.2)}


def test_report_adjusts_by_the_token_baseline():
    rng = np.random.default_rng(1)
    states = rng.standard_normal((20, 6, 8)) + 3.0  # a shared offset: anisotropic tokens
    mask = np.ones((20, 6))
    ids = rng.integers(3, 10, size=(20, 6))
    ids[:, 0] = 2  # [CLS], skipped
    report = isotropy_report(states=states, mask=mask, token_ids=ids, sentences=states.mean(1), skip_tokens=(2,),
                             num_frequent=3)
    assert report["token_anisotropy"] > 0.5
    assert report["intra_sentence_adjusted"] == pytest.approx(report["intra_sentence"] - report["token_anisotropy"])
    assert report["self_similarity_content_adjusted"] == pytest.approx(
        report["self_similarity_content"] - report["token_anisotropy"])
