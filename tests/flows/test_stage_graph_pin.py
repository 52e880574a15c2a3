"""The stage graph pinned (issue 57): for the tiny presets and the variants of the stage loop (naive inheritance, a
HEX control that retrains every stage, a cumulative concat), the steps a run makes (what, title, stage, kind,
members, step directory with its content key), the result names its tables read, and the plan's rows from a fixed
calibration (seconds, RAM, disk, what each rests on) are the ones recorded in ``data/stage_graph.json``. A refactor
of the runner or the planner that changes a key (every finished step recomputed), a title, a result or a projection
fails here.

Regenerate after a change made on purpose: ``python -m tests.flows.test_stage_graph_pin`` (and say why in the
commit)."""
import json
from pathlib import Path

import pytest

from pipeline_config.loader import load_config

PINNED = Path(__file__).with_name("data") / "stage_graph.json"
PRESETS = ("trifeature_tiny", "clip_tiny", "text_tiny", "embeddings_tiny", "paper_table5_inheritance",
           "trifeature_simclr_hex", "trifeature_quick")
#: the prepared data's record as the content keys read it (its digest): fixed, so the keys are the config's alone
DATA = {"digest": "pinned-data", "dir": "/pinned/data", "num_train": 1000}
#: device and precision fixed: ``auto`` resolves per machine, and is keyed as it resolves
OVERRIDES = ("device=cpu", "train.precision=fp32", "output_dir=/pinned/runs", "data.cache_dir=/pinned/cache")


def calibration(P, config):
    """A calibration with a rate for every kind of step, so every estimator's branch is exercised."""
    rate = {name: P.Rate(fixed_s=0.5 + i / 10, per_unit_s=0.001 * (i + 1), units=1000, peak_rss=10 ** 8 * (i + 1),
                         disk=10 ** 6 * (i + 1), gpu_mem=None, batch=16, note=name)
            for i, name in enumerate(("prepare", "train", "train_cold", "export", "cluster", "cluster_cold",
                                      "pseudo_labels", "pseudo_labels_cold", "regroup", "eval", "encode", "soup",
                                      "hyper", "scope"))}
    return P.Calibration(machine="pinned", device="cpu", measured_at="pinned", config_hash=config.config_hash(),
                         seconds=1.0, num_train=500, num_exported=None, dim=None, data_bytes=10 ** 7, id_bytes=12.0,
                         rates=rate)


def snapshot() -> dict:
    """What the pin holds, from today's code."""
    from flows.plan_steps import planned_results, planned_steps
    from planning import model as P
    out = {}
    for preset in PRESETS:
        config = load_config(preset, list(OVERRIDES))
        steps = planned_steps(config, data=DATA)
        costs = P.RunCosts(machine="pinned", measured_at="pinned", start_s=3.0, task_s=0.25, end_s=1.0, tasks=4)
        plans = {"closed forms": P.estimate(config, steps, calibration=None),
                 "calibrated": P.estimate(config, steps, calibration=calibration(P, config), run_costs=costs)}
        out[preset] = {
            "steps": [[s.what, s.title, s.stage, s.kind, s.members, s.step_dir] for s in steps],
            "results": planned_results(config, data=DATA),
            "plans": {name: {"rows": [[r.title, r.seconds, r.peak_ram, r.disk, r.gpu_mem, r.critical, r.basis]
                                      for r in plan.rows],
                             "overhead": plan.overhead, "total_s": plan.total_s}
                      for name, plan in plans.items()}}
    return json.loads(json.dumps(out))  # tuples as lists, as the file holds them


@pytest.mark.parametrize("preset", PRESETS)
def test_the_steps_keys_results_and_plan_of_each_preset_are_pinned(preset):
    pinned = json.loads(PINNED.read_text())[preset]
    now = snapshot_of(preset)
    assert now["steps"] == pinned["steps"]
    assert now["results"] == pinned["results"]
    for name, plan in pinned["plans"].items():
        assert _rounded(now["plans"][name]) == _rounded(plan), (preset, name)


def _rounded(value):
    """Floats to 9 significant digits: the same arithmetic, written in another order, agrees to that."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


_SNAPSHOT: dict = {}


def snapshot_of(preset: str) -> dict:
    if not _SNAPSHOT:
        _SNAPSHOT.update(snapshot())
    return _SNAPSHOT[preset]


if __name__ == "__main__":
    PINNED.parent.mkdir(exist_ok=True)
    PINNED.write_text(json.dumps(snapshot(), indent=1) + "\n")
    print(f"wrote {PINNED}")
