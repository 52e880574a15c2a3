"""Scaled-down, CPU-sized measurement of MCL across the method zoo (docs/methods.md): for each method and seed,
stage 0 on random batches, k-means on its embeddings, stage 1 on cluster-pure batches, and the linear probe per
attribute of stage 0, stage 1 and their concatenation. Also measures what a cluster-pure batch changes in each
method's loss: the stage-0 model's mean loss on cluster-pure batches over its mean loss on random batches of the
same samples and the same augmentation draws (1 for a method whose loss never looks at the other samples).

    .venv/bin/python scripts/measure_zoo_mcl.py --methods simclr byol --seeds 0 1 2 --out runs/zoo_mcl.json

Library calls only (no Prefect, no MLflow): contrastive.modalities.image.steps and contrastive.mcl.steps, the steps the flow runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contrastive.modalities.image import steps as stages  # noqa: E402
from contrastive.modalities.image.augment import TwoViewAugment  # noqa: E402
from contrastive.data.loading import iter_batches  # noqa: E402
from contrastive.modalities.image.datasets.trifeature import prepare_trifeature  # noqa: E402
from contrastive.engine.safe_load import load_torch_file  # noqa: E402
from contrastive.engine.task import LoopSpec, OptimSpec  # noqa: E402
from contrastive.mcl import steps  # noqa: E402

MODEL = dict(encoder="small_cnn", widths=[32, 64, 128, 256], projection_hidden=256, projection_dim=128)
AUGMENT = dict(crop_scale=(0.25, 1.0), crop_ratio=(0.75, 4.0 / 3.0), hflip=False, color_jitter=0.0)
SMALL_AMDIM = {"image_size": 32, "width": 16, "rkhs_dim": 128}
METHODS = {
    "simclr": {"name": "simclr", "temperature": 0.2},
    "moco_v2": {"name": "moco_v2", "temperature": 0.2, "moco": {"queue_size": 1024, "momentum": 0.99}},
    "nnclr": {"name": "nnclr", "temperature": 0.2, "nnclr": {"queue_size": 1024, "predictor_hidden": 256}},
    "byol": {"name": "byol", "temperature": 0.2, "byol": {"tau_base": 0.99, "predictor_hidden": 256}},
    "amdim": {"name": "amdim", "temperature": 0.2, "amdim": SMALL_AMDIM},
    "yadim": {"name": "yadim", "temperature": 0.2, "amdim": SMALL_AMDIM},
    "cpc_v2": {"name": "cpc_v2", "temperature": 0.2, "amdim": SMALL_AMDIM},
}


def spec(*, dataset_dir, stage_dir, method, seed, epochs, batch, pseudo=None):
    return stages.ImageStageSpec(
        dataset_dir=str(dataset_dir), stage_dir=str(stage_dir), pseudo_labels_path=None if pseudo is None
        else str(pseudo), model=MODEL, method=method, augment=AUGMENT, batch_size=batch, seed=seed, device="cpu",
        remainder_policy="partial", optim=OptimSpec(name="adam", lr=1e-3, weight_decay=1e-6, schedule="cosine"),
        loop=LoopSpec(epochs=epochs, checkpoint_every_steps=10_000, log_every_steps=50, channels_last=True),
        threads=2)


@torch.no_grad()
def batch_composition_ratio(*, model_path, dataset_dir, groups, batch, seed, batches=16):
    """Mean training loss of the trained stage-0 model (train mode: batch statistics, as in training) on
    ``batches`` cluster-pure batches and on as many random batches of the training split (no optimizer step)."""
    method = stages.load_trained_model(model_path=model_path, device=torch.device("cpu")).train()
    dataset = stages.load_dataset(dataset_dir)
    train = dataset.indices("train")
    rng = np.random.default_rng(seed)
    augment = TwoViewAugment(**AUGMENT)
    pure, mixed = [], []
    big = [g for g in np.unique(groups) if (groups == g).sum() >= batch]

    def read(rows):  # uint8 (b, C, S, S) of training-split positions
        return next(iter(iter_batches(dataset, iter([train[rows]]), workers=0)))[1]

    for number in range(batches):
        rows = rng.choice(np.flatnonzero(groups == big[number % len(big)]), size=batch, replace=False)
        view1, view2 = augment(read(rows), torch.Generator().manual_seed(number))
        loss_pure, _ = method.training_loss(view1, view2, step=0)
        method.load_state_dict(load_torch_file(model_path, what="trained model")["state_dict"])  # undo queue updates
        # A random batch of the training split, crops drawn with the same generator seed.
        random_rows = rng.choice(len(groups), size=batch, replace=False)
        r1, r2 = augment(read(random_rows), torch.Generator().manual_seed(number))
        loss_mixed, _ = method.training_loss(r1, r2, step=0)
        pure.append(float(loss_pure))
        mixed.append(float(loss_mixed))
        method.load_state_dict(load_torch_file(model_path, what="trained model")["state_dict"])  # undo queue updates
    return float(np.mean(pure)), float(np.mean(mixed))


def run_one(*, name, seed, root, dataset_dir, epochs, batch, k):
    work = root / f"{name}-seed{seed}"
    method = METHODS[name]
    started = time.perf_counter()
    s0 = stages.train_stage(spec(dataset_dir=dataset_dir, stage_dir=work / "stage0", method=method, seed=seed,
                                 epochs=epochs, batch=batch))
    stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=Path(s0["model_path"]),
                                        out_dir=work / "emb0", batch_size=256, device="cpu")
    dataset = stages.load_dataset(dataset_dir)
    train_ids = dataset.ids[dataset.indices("train")]
    steps.cluster_stage(embeddings_dir=work / "emb0", out_dir=work / "clusters0",
                        kmeans_spec=steps.KMeansSpec(k=k, seed=seed), earlier_cluster_dirs=[], ids=train_ids)
    stats = steps.build_pseudo_labels(cluster_dirs=[work / "clusters0"], embeddings_dirs=[work / "emb0"],
                                      out_path=work / "pseudo1.npz", min_group_size=batch,
                                      small_group_policy="merge_nearest", ids=train_ids)
    groups = np.load(work / "pseudo1.npz")["groups"]
    s1 = stages.train_stage(spec(dataset_dir=dataset_dir, stage_dir=work / "stage1", method=method, seed=seed + 100,
                                 epochs=epochs, batch=batch, pseudo=work / "pseudo1.npz"))
    stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=Path(s1["model_path"]), out_dir=work / "emb1",
                                   batch_size=256, device="cpu")
    probe = dict(probe_c=1.0, probe_max_iter=200, probe_max_train=4000, knn_k=10, seed=seed)
    result = {
        "stage0": stages.evaluate_embeddings(dataset_dir=dataset_dir, embeddings_dirs=[work / "emb0"], **probe),
        "stage1": stages.evaluate_embeddings(dataset_dir=dataset_dir, embeddings_dirs=[work / "emb1"], **probe),
        "concat": stages.evaluate_embeddings(dataset_dir=dataset_dir, embeddings_dirs=[work / "emb0", work / "emb1"],
                                             **probe),
        "groups": stats["num_groups"], "views_per_s_stage0": s0["views_per_second"],
    }
    pure, mixed = batch_composition_ratio(model_path=s0["model_path"], dataset_dir=dataset_dir, groups=groups,
                                          batch=batch, seed=seed)
    result.update(loss_cluster_pure=pure, loss_random=mixed, seconds=time.perf_counter() - started)
    return result


LABELS = {"simclr": "SimCLR", "moco_v2": "MoCo-v2", "nnclr": "NNCLR", "byol": "BYOL", "amdim": "AMDIM",
          "yadim": "YADIM", "cpc_v2": "CPC v2"}
ATTRIBUTES = ("color", "shape", "texture")


def mean_std(values: list[float]) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def report(results: dict) -> str:
    """Markdown: per method, stage 0 and MCL concat linear-probe accuracy per attribute (mean ± sample std over
    the seeds present), the control's concat on shape and MCL's margin over it, the cluster-pure / random loss
    ratio and minutes per seed (control included)."""
    methods = list(dict.fromkeys(key.split("/")[0] for key in results))
    lines = ["| method | seeds | stage 0 colour | stage 0 shape | stage 0 texture | MCL concat colour | "
             "MCL concat shape | MCL concat texture | control concat shape | shape: MCL concat - control | "
             "loss pure / random | min per seed |", "|---|---|" + "---|" * 10]
    for name in methods:
        runs = [r for key, r in results.items() if key.split("/")[0] == name]
        cells = [mean_std([r[rep][f"probe/{a}"] for r in runs]) for rep in ("stage0", "concat") for a in ATTRIBUTES]
        controlled = [r for r in runs if "control_concat" in r]
        control = mean_std([r["control_concat"]["probe/shape"] for r in controlled]) if controlled else "-"
        gain = mean_std([r["concat"]["probe/shape"] - r["control_concat"]["probe/shape"] for r in controlled]) \
            if controlled else "-"
        ratio = np.mean([r["loss_cluster_pure"] / r["loss_random"] for r in runs])
        minutes = np.mean([r["seconds"] + r.get("control_seconds", 0.0) for r in runs]) / 60
        lines.append(f"| {LABELS.get(name, name)} | {len(runs)} | " + " | ".join(cells)
                     + f" | {control} | {gain} | x{ratio:.2f} | {minutes:.1f} |")
    return "\n".join(lines)


def run_control(*, name, seed, root, dataset_dir, epochs, batch) -> dict:
    """The control of one measured pair: a second stage trained like stage 1 (same seed, same epochs) but on random
    batches, concatenated with stage 0. Its gain over stage 0 is what an ensemble of two runs gives without MCL's
    cluster-pure batches."""
    work = root / f"{name}-seed{seed}"
    started = time.perf_counter()
    control = stages.train_stage(spec(dataset_dir=dataset_dir, stage_dir=work / "control1", method=METHODS[name],
                                      seed=seed + 100, epochs=epochs, batch=batch))
    stages.export_stage_embeddings(dataset_dir=dataset_dir, model_path=Path(control["model_path"]),
                                   out_dir=work / "emb_control1", batch_size=256, device="cpu")
    probe = dict(probe_c=1.0, probe_max_iter=200, probe_max_train=4000, knn_k=10, seed=seed)
    concat = stages.evaluate_embeddings(dataset_dir=dataset_dir, embeddings_dirs=[work / "emb0",
                                                                                   work / "emb_control1"], **probe)
    return {"control_concat": concat, "control_seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", nargs="+", default=["simclr", "byol"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--root", default="runs/zoo_mcl")
    parser.add_argument("--out", default="runs/zoo_mcl.json")
    parser.add_argument("--control", action="store_true", help="also train each pair's control (stage 1 on random "
                        "batches, concatenated with stage 0)")
    parser.add_argument("--report", action="store_true", help="print the markdown table of --out and stop")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(Path(args.out).read_text())))
        return
    root = Path(args.root)
    dataset_dir = prepare_trifeature(root=root / "data", num_train=args.num_train, num_test=500, image_size=32,
                                     seed=0)
    results = {}
    out = Path(args.out)
    if out.exists():
        results = json.loads(out.read_text())
    for name in args.methods:
        for seed in args.seeds:
            key = f"{name}/{seed}"
            if key in results:
                if args.control and "control_concat" not in results[key]:
                    results[key].update(run_control(name=name, seed=seed, root=root, dataset_dir=dataset_dir,
                                                    epochs=args.epochs, batch=args.batch))
                    out.write_text(json.dumps(results, indent=1))
                    print(key, "control concat", {a: round(v, 3) for a, v in
                                                  results[key]["control_concat"].items() if "probe" in a}, flush=True)
                continue
            results[key] = run_one(name=name, seed=seed, root=root, dataset_dir=dataset_dir, epochs=args.epochs,
                                   batch=args.batch, k=args.k)
            if args.control:
                results[key].update(run_control(name=name, seed=seed, root=root, dataset_dir=dataset_dir,
                                                epochs=args.epochs, batch=args.batch))
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=1))
            r = results[key]
            print(key, {s: {a: round(v, 3) for a, v in r[s].items() if a.endswith("probe") or "probe" in a}
                        for s in ("stage0", "stage1", "concat")}, "loss cluster-pure / random batches",
                  round(r["loss_cluster_pure"], 3), round(r["loss_random"], 3), f"{r['seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
