"""HEX vs plain on the hierarchical Trifeature data (contrastive.modalities.image.datasets.hierarchical): a tiny, honest comparison.

    .venv/bin/python -m bench.hex_hierarchy --seeds 0 1 2 --epochs 6 --num-train 1024 --num-test 512 \
        --widths 16 32 64 128 --hue-spread 0.015 --variants simclr simclr+hex_authors

For each seed the chosen ``--variants`` (SimCLR, SimCLR + HEX with the authors' settings and the warm-up scaled to
the short run, SimCLR + HEX with an adaptive threshold and Q = 0.5, NNCLR and NNCLR + HEX the authors' way) train
the same encoder on the same batches through the engine; the frozen
backbone features are probed (linear probe on every train label, and on 1 % of them: the poster's semi-supervised
column) for the fine and coarse labels. For each model we also measure, on the test split in batches like
training's, HEX's precision: the share of H(i) (the authors' threshold applied to that model's projections) that
truly shares the anchor's coarse class, beside the base rate (the share of all negatives that do).
Prints one JSON line per run and a mean +- std table; writes bench/results/hex_hierarchy.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from contrastive.modalities.image.augment import TwoViewAugment
from contrastive.modalities.image.datasets.hierarchical import HierarchySpec, generate_hierarchical
from contrastive.engine.distributed import DistInfo
from contrastive.engine.loop import train
from contrastive.engine.rng import seed_everything
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.evaluate import linear_probe_accuracy
from contrastive.methods.hex import EpsilonRule, HexSettings, QRule
from contrastive.methods.losses import cosine_matrix, two_view_negatives
from contrastive.mcl.sampler import ClusterBatchSampler
from contrastive.methods import build_method
from contrastive.modalities.image.adapter import ImageBatchSource, ImageContrastiveTask

MODEL = dict(encoder="small_cnn", widths=[32, 64, 128, 256], projection_hidden=256, projection_dim=128)
AUGMENT = dict(crop_scale=(0.25, 1.0), crop_ratio=(0.75, 4 / 3), hflip=False, color_jitter=0.0)


def variants(epochs: int) -> dict[str, dict]:
    """name -> method section. The authors warm up 10 of their hundreds of epochs; here a quarter of the run."""
    from contrastive.modalities.image.config import MethodConfig
    authors = HexSettings.authors(warmup_epochs=max(1.0, epochs // 4))
    q_half = HexSettings(enabled=True, epsilon=EpsilonRule(mode="adaptive", percentile=90.0), q=QRule(value=0.5))
    out = {name: MethodConfig(name="simclr", temperature=0.2, hex=hex).model_dump(mode="json")
           for name, hex in (("simclr", HexSettings()), ("simclr+hex_authors", authors),
                             ("simclr+hex_q0.5", q_half))}
    out.update({name: MethodConfig(name="nnclr", temperature=0.1, nnclr={"queue_size": 512},
                                   hex=hex).model_dump(mode="json")
                for name, hex in (("nnclr", HexSettings()), ("nnclr+hex_authors", authors))})
    return out


def train_one(*, method_kwargs: dict, images: torch.Tensor, epochs: int, batch_size: int, seed: int, out: Path):
    seed_everything(seed)
    method = build_method(model_kwargs=MODEL, method_kwargs=method_kwargs)
    sampler = ClusterBatchSampler(groups=None, num_samples=len(images), batch_size=batch_size, seed=seed)
    source = ImageBatchSource(sampler=sampler, ids=np.arange(len(images)), groups=None, info=DistInfo(),
                              read_batches=lambda planned: ((rows, images[torch.from_numpy(rows)])
                                                            for rows in planned))
    task = ImageContrastiveTask(method=method, augment=TwoViewAugment(**AUGMENT), seed=seed, channels_last=True,
                                epochs=epochs)
    result = train(task=task, source=source, optim=OptimSpec(name="adam", lr=1e-3, weight_decay=1e-6),
                   loop=LoopSpec(epochs=epochs, checkpoint_every_steps=10**9, log_every_steps=10,
                                 channels_last=True),
                   device=torch.device("cpu"), checkpoint_path=out / "last.pt")
    return method.eval(), result


@torch.no_grad()
def features(method, images: torch.Tensor, batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(backbone features, projections) of uint8 NHWC-as-NCHW images, scaled as the augmentation does."""
    feats, projs = [], []
    for start in range(0, len(images), batch):
        x = images[start:start + batch].float() / 255.0
        f = method.backbone(x)
        feats.append(f.numpy())
        projs.append(method.head(f).numpy())
    return np.concatenate(feats), np.concatenate(projs)


def hex_precision(projections: np.ndarray, coarse: np.ndarray, *, batch: int, seed: int) -> dict[str, float]:
    """Mean over anchors of |H(i) n same coarse| / |H(i)| with the authors' threshold (min-max cosine > 0.9),
    batches of ``batch`` test samples (one view each), and the base rate of same-coarse negatives."""
    rule = HexSettings.authors(warmup_epochs=0.0).rule()
    order = np.random.default_rng(seed).permutation(len(projections))
    precision, base, size = [], [], []
    for start in range(0, len(order) - batch + 1, batch):
        rows = order[start:start + batch]
        z = torch.from_numpy(projections[rows])
        labels = torch.from_numpy(coarse[rows])
        negatives = ~torch.eye(batch, dtype=torch.bool)
        selection = rule.select(cosines=cosine_matrix(z, z), negatives=negatives, step=0, total_steps=1)
        same = (labels[:, None] == labels[None, :]) & negatives
        h = selection.hierarchy
        has = h.sum(1) > 0
        precision.append(((h & same).sum(1)[has].float() / h.sum(1)[has].float()).mean().item())
        base.append((same.sum(1).float() / negatives.sum(1).float()).mean().item())
        size.append(h.sum(1).float().mean().item())
    return {"hex_precision": float(np.mean(precision)), "same_coarse_base_rate": float(np.mean(base)),
            "mean_h_size": float(np.mean(size))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-test", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256], help="small_cnn widths")
    parser.add_argument("--hue-spread", type=float, default=HierarchySpec.hue_spread)
    parser.add_argument("--variants", nargs="+", default=["simclr", "simclr+hex_authors", "simclr+hex_q0.5"])
    parser.add_argument("--out", type=Path, default=Path("bench/results/hex_hierarchy.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    MODEL["widths"] = list(args.widths)
    spec = HierarchySpec(hue_spread=args.hue_spread)
    images, labels = generate_hierarchical(num_train=args.num_train, num_test=args.num_test, spec=spec, seed=0)
    images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    train_rows, test_rows = np.arange(args.num_train), np.arange(args.num_train, args.num_train + args.num_test)
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="hex_hierarchy_"))  # fresh checkpoints: never resume an older run
    started = time.perf_counter()
    for seed in args.seeds:
        one_percent = np.random.default_rng(seed).permutation(args.num_train)[:max(spec.num_fine,
                                                                                args.num_train // 100)]
        for name, method_kwargs in variants(args.epochs).items():
            if name not in args.variants:
                continue
            t0 = time.perf_counter()
            method, result = train_one(method_kwargs=method_kwargs, images=images[train_rows], epochs=args.epochs,
                                       batch_size=args.batch_size, seed=seed,
                                       out=scratch / f"{name}_{seed}")
            train_x, _ = features(method, images[train_rows])
            test_x, test_z = features(method, images[test_rows])
            row = {"variant": name, "seed": seed, "train_seconds": round(time.perf_counter() - t0, 1),
                   "final_loss": result.final_loss}
            for label in ("fine", "coarse"):
                y_train, y_test = labels[label][train_rows], labels[label][test_rows]
                row[f"probe/{label}"] = linear_probe_accuracy(train_x=train_x, train_y=y_train, test_x=test_x,
                                                              test_y=y_test, c=1.0, max_iter=300)
                row[f"probe_1pct/{label}"] = linear_probe_accuracy(
                    train_x=train_x[one_percent], train_y=y_train[one_percent], test_x=test_x, test_y=y_test,
                    c=1.0, max_iter=300)
            row.update(hex_precision(test_z, labels["coarse"][test_rows], batch=args.batch_size, seed=seed))
            last = result.history[-1] if result.history else {}
            row.update({k: v for k, v in last.items() if k.startswith("hex/")})
            print(json.dumps(row), flush=True)
            rows.append(row)
    table = {}
    for name in args.variants:
        mine = [r for r in rows if r["variant"] == name]
        table[name] = {key: (statistics.mean(r[key] for r in mine),
                             statistics.stdev(r[key] for r in mine) if len(mine) > 1 else 0.0)
                       for key in ("probe/fine", "probe/coarse", "probe_1pct/fine", "probe_1pct/coarse",
                                   "hex_precision", "same_coarse_base_rate")}
    print(f"\n{'variant':22s} " + " ".join(f"{k:>18s}" for k in next(iter(table.values()))))
    for name, values in table.items():
        print(f"{name:22s} " + " ".join(f"{m:8.3f} +- {s:5.3f}" for m, s in values.values()))
    wall = time.perf_counter() - started
    print(f"wall {wall:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                    "table": table, "wall_seconds": wall}, indent=1))


if __name__ == "__main__":
    main()
