"""Evaluation of representations: linear probe and kNN per attribute, plus plots."""
from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from contrastive.engine.device import available_cores
from contrastive.integrate import l2_normalize
from contrastive.plotting import grouped_bars, locked_pyplot, save_figure


def silence_probe_convergence_warnings() -> None:
    """Ignore scikit-learn's ConvergenceWarning for the rest of the process (installed again if a caller's
    ``warnings.catch_warnings`` removed it). A process-wide filter on purpose: ``catch_warnings`` is not
    thread-safe, and the probes run in threads (the attributes side by side, two pipelines in one worker), where
    one thread's exit restored the filters under another's probe and its warning reached the run's log."""
    deciding = next(((action, category) for action, _, category, *_ in warnings.filters
                     if issubclass(ConvergenceWarning, category)), None)
    if deciding != ("ignore", ConvergenceWarning):  # the first filter that matches decides
        warnings.filterwarnings("ignore", category=ConvergenceWarning)


def linear_probe_accuracy(*, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                          c: float, max_iter: int) -> float:
    """Multinomial logistic regression on standardised frozen features; top-1 accuracy on the test split.

    train_x (N, D), train_y (N,) int; test_x (T, D), test_y (T,). Samples labelled -1 (unknown) are ignored.
    """
    train_mask, test_mask = train_y >= 0, test_y >= 0
    if train_mask.sum() == 0 or test_mask.sum() == 0:
        return float("nan")
    # One BLAS thread: a probe's products are small (N x D by D x classes), so a thread team gains little and its
    # threads spin-wait for each other; on a 2-core machine shared with other processes (2026-11-26, load 20) a
    # probe of 8,000 x 256 features took 14-17 s with 2 OpenBLAS threads and 1.2 s with one.
    with threadpool_limits(limits=1, user_api="blas"):
        scaler = StandardScaler().fit(train_x[train_mask])
        probe = LogisticRegression(C=c, max_iter=max_iter)
        silence_probe_convergence_warnings()  # a probe stopped at max_iter is still a valid (slightly pessimistic)
        probe.fit(scaler.transform(train_x[train_mask]), train_y[train_mask])  # measurement; the config sets it
        return float((probe.predict(scaler.transform(test_x[test_mask])) == test_y[test_mask]).mean())


def knn_accuracy(*, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, k: int,
                 temperature: float = 0.1, chunk: int = 1024) -> float:
    """Weighted kNN on cosine similarity (Wu et al., 2018): class score = sum over the k nearest train samples of
    exp(s / temperature). train_x (N, D), test_x (T, D); labels -1 ignored."""
    train_mask, test_mask = train_y >= 0, test_y >= 0
    if train_mask.sum() == 0 or test_mask.sum() == 0:
        return float("nan")
    bank = torch.from_numpy(l2_normalize(train_x[train_mask]).astype(np.float32))
    bank_labels = torch.from_numpy(train_y[train_mask].astype(np.int64))
    queries = torch.from_numpy(l2_normalize(test_x[test_mask]).astype(np.float32))
    targets = torch.from_numpy(test_y[test_mask].astype(np.int64))
    num_classes = int(bank_labels.max()) + 1
    k = min(k, len(bank))
    correct = 0
    for start in range(0, len(queries), chunk):
        sims, idx = (queries[start:start + chunk] @ bank.T).topk(k, dim=1)
        votes = torch.zeros(len(idx), num_classes).scatter_add_(1, bank_labels[idx], (sims / temperature).exp())
        correct += int((votes.argmax(1) == targets[start:start + chunk]).sum())
    return correct / len(queries)


def evaluate_representation(*, train_x: np.ndarray, test_x: np.ndarray, train_labels: dict[str, np.ndarray],
                            test_labels: dict[str, np.ndarray], probe_c: float, probe_max_iter: int,
                            probe_max_train: int, knn_k: int, seed: int) -> dict[str, float]:
    """Linear-probe and kNN accuracy for every attribute: {"probe/<attr>": acc, "knn/<attr>": acc}."""
    rng = np.random.default_rng(seed)
    subset = np.sort(rng.permutation(len(train_x))[:probe_max_train])

    def score(attribute: str) -> dict[str, float]:
        return {f"probe/{attribute}": linear_probe_accuracy(
                    train_x=train_x[subset], train_y=train_labels[attribute][subset], test_x=test_x,
                    test_y=test_labels[attribute], c=probe_c, max_iter=probe_max_iter),
                f"knn/{attribute}": knn_accuracy(train_x=train_x, train_y=train_labels[attribute], test_x=test_x,
                                                 test_y=test_labels[attribute], k=knn_k)}

    # The attributes side by side, one per core: each probe's products run on one BLAS thread (set here for all of
    # them; threadpoolctl's limit is per process, so no thread may restore another's) and release the GIL, so 3
    # attributes on 2 cores took 2.5 s instead of 3.8 s (8,000 x 512, 2026-11-27).
    attributes = sorted(train_labels)
    with threadpool_limits(limits=1, user_api="blas"):
        with ThreadPoolExecutor(max_workers=max(1, min(len(attributes), available_cores()))) as pool:
            scored = list(pool.map(score, attributes))
    return {name: value for part in scored for name, value in part.items()}


def read_stage_embeddings(*, dataset, embeddings_dirs: list) -> list[np.ndarray]:
    """Every stage's exported embeddings, float32 (N, D_j), each verified to hold exactly ``dataset``'s ids in its
    order (a ``contrastive.data.dataset.SampleIndex``), so rows line up with its split and labels."""
    from contrastive.embeddings import load_embeddings
    stage_embeddings = []
    for directory in embeddings_dirs:
        ids, embeddings = load_embeddings(directory=Path(directory))
        dataset.verify_ids(ids)
        stage_embeddings.append(embeddings)
    return stage_embeddings


def score_attributes(*, dataset, features: np.ndarray, probe_c: float, probe_max_iter: int, probe_max_train: int,
                     knn_k: int, seed: int) -> dict[str, float]:
    """:func:`evaluate_representation` of (N, D) ``features`` (rows in ``dataset``'s order) fitted on its train
    split and scored on its test split, per attribute; {} when it has no attributes or no test split."""
    train, test = dataset.indices("train"), dataset.indices("test")
    if not dataset.labels or not len(test):
        return {}
    return evaluate_representation(
        train_x=features[train], test_x=features[test],
        train_labels={a: y[train] for a, y in dataset.labels.items()},
        test_labels={a: y[test] for a, y in dataset.labels.items()},
        probe_c=probe_c, probe_max_iter=probe_max_iter, probe_max_train=probe_max_train, knn_k=knn_k, seed=seed)


def plot_attribute_accuracy(*, results: dict[str, dict[str, float]], path: Path, metric: str = "probe",
                            title: str = "Linear-probe accuracy per attribute") -> Path:
    """Grouped bars: one group per representation (stage 0, stage 1, ..., concat), one bar per attribute."""
    with locked_pyplot() as plt:
        fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(results), 3.6))
        grouped_bars(ax, results=results, prefix=metric, value_format="%.2f")
        ax.set_ylim(0, 1.08)
        ax.set_ylabel(f"{metric} accuracy")
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=8)
        return save_figure(plt, fig, path, dpi=120)


def plot_cluster_sizes(*, sizes_by_stage: dict[str, list[int]], path: Path) -> Path:
    """One histogram of cluster sizes per clustered stage (sorted descending, log y)."""
    with locked_pyplot() as plt:
        fig, axes = plt.subplots(1, max(1, len(sizes_by_stage)), figsize=(4 * max(1, len(sizes_by_stage)), 3),
                                 squeeze=False)
        for ax, (name, sizes) in zip(axes[0], sizes_by_stage.items()):
            ordered = sorted(sizes, reverse=True)
            ax.bar(np.arange(len(ordered)), ordered, width=1.0)
            ax.set_yscale("log")
            ax.set_title(f"{name}: {len(ordered)} clusters")
            ax.set_xlabel("cluster (sorted by size)")
            ax.set_ylabel("samples")
        return save_figure(plt, fig, path, dpi=120)
