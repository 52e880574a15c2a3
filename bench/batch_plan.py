"""Batch plan of one MCL epoch: ``plan_batches`` (vectorised) against ``plan_batches_reference`` (the literal
pure-Python MCL Algorithm 1: dict of lists, sort per group, slice, shuffle batches).

Goal (issue 6): M = 12M samples, 1,000 pseudo-label groups, batch 8,192: >= 50x faster than the reference and
< 2 s, memory O(M) integers only.

The reference needs about 3 s per million samples here, so running it at 12M would take most of a minute per
repetition and several GiB of Python objects. It is measured side by side with ours at four smaller sizes, and its
time at 12M is EXTRAPOLATED along the log-log line fitted through those four points (slope reported). Ours is
measured at 12M directly. The ratio at the largest size both ran at is reported too: that one is fully measured.
"""
from __future__ import annotations

import numpy as np

from bench.common import (Result, extrapolate, fmt_bytes, fmt_count, fmt_seconds, interleaved, log,
                          loglog_slope, median, module_main, peak_tracemalloc)
from contrastive.mcl.batch_plan import plan_batches
from tests.unit.mcl.reference import plan_batches_reference

NUM_GROUPS = 1000
BATCH = 8192
FULL_M = 12_000_000


def make_groups(num_samples: int, *, seed: int = 0) -> np.ndarray:
    """Pseudo-labels of 1,000 groups with unequal sizes (Dirichlet(2) proportions), int64 (M,)."""
    rng = np.random.default_rng(seed)
    weights = rng.dirichlet(np.full(NUM_GROUPS, 2.0))
    return rng.choice(NUM_GROUPS, size=num_samples, p=weights).astype(np.int64)


def run(*, quick: bool) -> list[Result]:
    target = 1_200_000 if quick else FULL_M
    # --quick keeps M / (groups x batch) as at full size, so groups still hold about 1.5 batches each.
    batch = BATCH * target // FULL_M
    ref_sizes = [50_000, 100_000, 200_000, 400_000] if quick else [250_000, 500_000, 1_000_000, 2_000_000]
    our_sizes = sorted({*ref_sizes, target // 4, target // 2, target})
    repeats = 3

    def ours(groups):
        return lambda: plan_batches(groups=groups, batch_size=batch, seed=0, epoch=1)

    def reference(groups):
        return lambda: plan_batches_reference(groups=groups, batch_size=batch, seed=0, epoch=1)

    ours_t: dict[int, float] = {}
    ref_t: dict[int, float] = {}
    ref_rss: dict[int, int | None] = {}
    for size in ref_sizes:
        groups = make_groups(size)
        plans = {}

        def keep(name, plan, plans=plans):
            plans[name] = plan

        rss: dict[str, int | None] = {}
        times = interleaved({"reference": reference(groups), "ours": ours(groups)}, repeats=repeats, keep=keep,
                            rss=rss)
        # Both implement the same algorithm on the same random stream: the plans must be identical.
        same = all(np.array_equal(getattr(plans["ours"], a), getattr(plans["reference"], a))
                   for a in ("indices", "offsets", "group_of_batch"))
        if not same:
            raise AssertionError(f"plan_batches and plan_batches_reference disagree at M={size}")
        ref_t[size], ours_t[size] = median(times["reference"]), median(times["ours"])
        ref_rss[size] = rss.get("reference")
        log(f"batch plan M={fmt_count(size)}: reference {fmt_seconds(ref_t[size])}, ours {fmt_seconds(ours_t[size])}")
    for size in our_sizes:
        if size in ours_t:
            continue
        groups = make_groups(size)
        cpu: dict[str, list[float]] = {}
        ours_t[size] = median(interleaved({"ours": ours(groups)}, repeats=repeats + 2, cpu=cpu)["ours"])
        ours_cpu = median(cpu["ours"])
        log(f"batch plan M={fmt_count(size)}: ours {fmt_seconds(ours_t[size])}")

    groups = make_groups(target)
    peak, plan = peak_tracemalloc(ours(groups))
    ref_at_target, ref_slope = extrapolate(sizes=ref_sizes, seconds=[ref_t[s] for s in ref_sizes], to=target)
    ours_slope = loglog_slope(our_sizes, [ours_t[s] for s in our_sizes])
    ratio = ref_at_target / ours_t[target]
    largest = ref_sizes[-1]
    measured_ratio = ref_t[largest] / ours_t[largest]
    passed = ratio >= 50 and ours_t[target] < 2.0
    ref_mem = ref_rss[largest]
    return [Result(
        name="Batch plan (MCL Alg. 1)",
        workload=f"M={fmt_count(target)}, {NUM_GROUPS} groups (Dirichlet sizes), batch {batch}, remainder 'partial'",
        baseline="plan_batches_reference (pure Python), extrapolated to M from 4 measured sizes",
        baseline_s=ref_at_target, ours_s=ours_t[target], ratio=ratio, goal=">= 50x and < 2 s", passed=passed,
        memory=(f"ours {fmt_bytes(peak)} tracemalloc peak ({peak / target:.0f} B/sample); reference "
                f"{fmt_bytes(ref_mem)} RSS delta at M={fmt_count(largest)}"
                + (f" ({ref_mem / largest:.0f} B/sample)" if ref_mem else "")),
        growth=f"ours {ours_slope:.2f}, reference {ref_slope:.2f}",
        notes=[
            f"reference at M={fmt_count(target)} is extrapolated along its log-log fit (slope {ref_slope:.2f}) from "
            f"M={', '.join(fmt_count(s) for s in ref_sizes)}; measured side by side at M={fmt_count(largest)}: "
            f"reference {fmt_seconds(ref_t[largest])}, ours {fmt_seconds(ours_t[largest])}, "
            f"{measured_ratio:.0f}x (plans checked identical at every measured size)",
            f"ours at M={fmt_count(target)}: {fmt_seconds(ours_t[target])} wall, {fmt_seconds(ours_cpu)} CPU (medians "
            f"of {repeats + 2}; the machine is shared, so wall time includes waiting for a core)",
            "ours by size: " + ", ".join(f"{fmt_count(s)} {fmt_seconds(ours_t[s])}" for s in our_sizes),
            f"plan at M={fmt_count(target)}: {plan.stats['num_batches']} batches, "
            f"{plan.stats['samples_dropped']} samples dropped (remainders < 2), "
            f"{plan.stats['groups_smaller_than_batch']} groups smaller than a batch",
        ],
        details={"ours": ours_t, "reference": ref_t, "reference_rss": ref_rss, "tracemalloc_peak": peak},
    )]


if __name__ == "__main__":
    module_main(run)
