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
