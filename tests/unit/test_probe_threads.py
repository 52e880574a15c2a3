"""The linear probe fits on one BLAS thread (a thread team spin-waits on a shared machine: contrastive/evaluate.py)."""
import numpy as np
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_info

from contrastive import evaluate


def test_the_probe_fits_on_one_blas_thread_and_gives_the_threads_back(monkeypatch):
    seen = []
    fit = LogisticRegression.fit

    def recording_fit(self, x, y):
        seen.extend(pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas")
        return fit(self, x, y)

    monkeypatch.setattr(LogisticRegression, "fit", recording_fit)
    before = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int)
    accuracy = evaluate.linear_probe_accuracy(train_x=x, train_y=y, test_x=x, test_y=y, c=1.0, max_iter=100)
    assert accuracy > 0.9
    assert seen and set(seen) == {1}
    assert [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"] == before


def _attributes(rng, n: int) -> dict:
    return {name: rng.integers(0, 5, n) for name in ("color", "shape", "texture")}


def test_the_attributes_are_probed_side_by_side_as_one_by_one_and_stay_quiet(monkeypatch):
    """evaluate_representation probes the attributes in threads: the same metrics, in the same order, as each
    attribute probed alone; a probe stopped at max_iter warns nothing, even with two evaluations at once and
    every warning shown (the filters of ``catch_warnings`` are process-wide, so a thread's exit used to restore
    them under another thread's probe)."""
    import threading
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 16)).astype(np.float32)
    labels = _attributes(rng, 600)
    train, test = slice(0, 400), slice(400, None)
    kwargs = dict(train_x=x[train], test_x=x[test], train_labels={a: y[train] for a, y in labels.items()},
                  test_labels={a: y[test] for a, y in labels.items()}, probe_c=1.0, probe_max_iter=3,
                  probe_max_train=400, knn_k=5, seed=0)
    expected = {}
    for attribute, y in sorted(labels.items()):
        expected[f"probe/{attribute}"] = evaluate.linear_probe_accuracy(
            train_x=x[train], train_y=y[train], test_x=x[test], test_y=y[test], c=1.0, max_iter=3)
        expected[f"knn/{attribute}"] = evaluate.knn_accuracy(train_x=x[train], train_y=y[train], test_x=x[test],
                                                             test_y=y[test], k=5)
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=lambda: results.append(evaluate.evaluate_representation(**kwargs)))
                   for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert results == [expected, expected] and list(results[0]) == list(expected)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
