"""What each method's training step costs, as a throughput ratio against SimCLR on the same encoder (info rows).

One training step = ``method.training_loss(view1, view2)`` + backward + Adam step + ``after_optimizer_step``
(the engine's step without data loading or augmentation), on a fixed batch of 64 random 32 x 32 views, fp32, CPU,
the same torch threads for every method. Methods on the default preset's encoder (``small_cnn`` 32/64/128/256,
head 256-256-128): MoCo-v2, NNCLR, BYOL against SimCLR. Methods whose own encoder is AMDIM's (AMDIM, YADIM with
its 3 x 3 patches of 16 px, CPC v2 with the same patches) against SimCLR with ``method.parts.encoder=amdim`` (the
same AMDIM encoder at width 32, rkhs 256 on whole 32 px views), so the ratio is the method's cost, not the
encoder's. Ratio = SimCLR's time per step / the method's (> 1: cheaper than SimCLR). Each method and its
baseline are timed interleaved (A B, B A, ...) after a warm-up step; medians compared.
"""
from __future__ import annotations

import torch

from bench.common import Result, interleaved, log, median, module_main, threads_note

BATCH = 64
SIDE = 32
AMDIM = {"image_size": 32, "width": 32, "rkhs_dim": 256, "depth": 1}
ON_BACKBONE = {
    "moco_v2": {"name": "moco_v2", "temperature": 0.2, "moco": {"queue_size": 4096, "momentum": 0.99}},
    "nnclr": {"name": "nnclr", "temperature": 0.2, "nnclr": {"queue_size": 4096, "predictor_hidden": 256}},
    "byol": {"name": "byol", "temperature": 0.2},
}
ON_AMDIM = {
    "amdim": {"name": "amdim", "temperature": 0.2, "amdim": AMDIM},
    "yadim": {"name": "yadim", "temperature": 0.2, "amdim": AMDIM},
    "cpc_v2": {"name": "cpc_v2", "temperature": 0.2, "amdim": AMDIM},
}
SIMCLR = {"name": "simclr", "temperature": 0.2}
SIMCLR_AMDIM = {"name": "simclr", "temperature": 0.2, "parts": {"encoder": "amdim"}, "amdim": AMDIM}


def step_runner(method_kwargs: dict, *, seed: int = 0):
    """A callable running one training step of a fresh method on a fixed batch."""
    from bench import fixtures
    from contrastive.methods import build_method

    torch.manual_seed(seed)
    method = build_method(model_kwargs=fixtures.model_kwargs(), method_kwargs=method_kwargs).train()
    method.on_train_start(total_steps=1000)
    optimizer = torch.optim.Adam([p for p in method.parameters() if p.requires_grad], lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    view1, view2 = (torch.rand(BATCH, 3, SIDE, SIDE, generator=generator) for _ in range(2))
    counter = [0]

    def step():
        loss, _ = method.training_loss(view1, view2, step=counter[0])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        method.after_optimizer_step(step=counter[0])
        counter[0] += 1
        return float(loss.detach())

    step()  # warm-up: allocator, first-touch costs
    return step


def run(*, quick: bool = False) -> list[Result]:
    torch.set_num_threads(1)
    repeats = 3 if quick else 7
    results = []
    for group, baseline_kwargs, baseline_name in ((ON_BACKBONE, SIMCLR, "SimCLR (small_cnn)"),
                                                  (ON_AMDIM, SIMCLR_AMDIM, "SimCLR (amdim encoder)")):
        baseline = step_runner(baseline_kwargs)
        for name, kwargs in group.items():
            log(f"method_zoo: {name} against {baseline_name}")
            ours = step_runner(kwargs)
            times = interleaved({"baseline": baseline, "ours": ours}, repeats=repeats)
            base_s, ours_s = median(times["baseline"]), median(times["ours"])
            results.append(Result(
                name=f"method zoo: {name} training step", baseline=baseline_name,
                workload=f"one training step (loss, backward, Adam, EMA/queue update), batch {BATCH} of {SIDE} px "
                         f"views, fp32, 1 torch thread; baseline {baseline_name}",
                baseline_s=base_s, ours_s=ours_s, ratio=base_s / ours_s,
                ratio_note="SimCLR step time / this method's (> 1: cheaper)", goal="info: what the method costs",
                passed=None, notes=[threads_note(), f"{repeats} interleaved repeats, medians"]))
    return results


if __name__ == "__main__":
    module_main(run)
