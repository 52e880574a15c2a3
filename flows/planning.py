"""The pipeline's steps before it runs, and its plan where users look while it runs.

:func:`planned_steps` runs the flow's own stage loop (``flows.runner.StepRunner``: ``run_stages``, ``run_control``,
``run_combined``, ``run_final``, in the order ``flows.pipeline.mcl_pipeline`` calls them) with a step that records
what it would run instead of running it, so the plan's rows are the steps a run makes, for every modality, and
cannot drift from them. :class:`ProgressRunner` is the runner the flow uses: after every step it updates the flow
run's progress artifact (stage i of N, time left by the plan's projections).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from flows.runner import StageRun, StepRunner, step_title
from pipeline_config.plan import Plan, PlannedStep, fmt_seconds, progress_percent, remaining_seconds

PREPARE = PlannedStep(what="prepare", title="prepare data")


class _Planned:
    """A step's record in a plan: its content key (what later steps' keys digest) and placeholders for the paths
    and metrics the runner passes on."""

    def __init__(self, key: str):
        self.key = key
        self.metrics: dict = {}

    def __getattr__(self, name: str) -> str:
        return f"<planned {name}>"


class PlanningRunner(StepRunner):
    """The stage runner with a step that records (what, title, stage, kind) and runs nothing."""

    def __init__(self, config, *, data: dict | None = None):
        super().__init__(config=config, data=data or {"dir": "<planned>", "digest": "planned", "num_train": 0},
                         parent_run_id="<planned>", pipeline_id=config.config_hash())
        self.planned: list[PlannedStep] = []

    def logger(self):
        return logging.getLogger(__name__)

    def step(self, task_fn, *, prefix: str, key: str, run_id, what: str, stage: int | None = None,
             **kwargs: Any):
        kind = run_id.kind if isinstance(run_id, StageRun) else "pipeline"
        self.planned.append(PlannedStep(
            what=what, title=step_title(what=what, run=run_id, stage=stage, for_stage=kwargs.get("for_stage")),
            stage=stage if stage is not None else kwargs.get("for_stage"), kind=kind,
            members=_count(kwargs.get("members"), kwargs.get("trained")), step_dir=f"{prefix}-{key}"))
        return _Planned(key)


def _count(*values) -> int:
    """How many representations a step reads: the first list among ``values`` (an evaluation's members, a soup's
    stage models), else one."""
    return next((len(v) for v in values if isinstance(v, list)), 1)


def run_all(runner: StepRunner):
    """Every step after the data is prepared, in the flow's order: (stage outputs, results, final metrics)."""
    outputs = runner.run_stages()
    results = {**outputs.results, **runner.run_control(outputs), **runner.run_combined(outputs)}
    return outputs, results, runner.run_final(outputs)


def planned_steps(config, *, data: dict | None = None) -> list[PlannedStep]:
    """The steps a run of ``config`` makes, in order: the data's preparation, then the runner's. With the prepared
    data's record (``data``), each step's ``step_dir`` is the directory the run writes it to (its content key holds
    the data's digest); without, a placeholder digest stands in."""
    runner = PlanningRunner(config, data=data)
    run_all(runner)
    return [PREPARE, *runner.planned]


class ProgressRunner(StepRunner):
    """The flow's runner, reporting after every step: "step i of N: <title>", percent of the projected time done,
    and the time the plan projects for the rest (a Prefect progress artifact and one log line)."""

    plan: Plan | None = None
    report = None  # callable(percent, description), set by the flow

    def step(self, task_fn, *, what: str, **kwargs: Any):
        record = super().step(task_fn, what=what, **kwargs)
        self._done = getattr(self, "_done", 1) + 1  # the data's preparation is step 1
        if self.plan is not None and self.report is not None:
            done = min(self._done, len(self.plan.rows))
            left = remaining_seconds(self.plan, done)
            self.report(progress_percent(self.plan, done),
                        f"step {done} of {len(self.plan.rows)} done ({what}); about {fmt_seconds(left)} left by "
                        f"the plan, at {time.strftime('%H:%M:%S')}")
        return record


def build_plan(config, *, calibrate: bool = True, recalibrate: bool = False,
               log: Callable[[str], None] = print) -> Plan:
    """The plan of ``config`` on this machine: its cached calibration (measured now when there is none and
    ``calibrate``; again with ``recalibrate``), the runner's steps, their projections."""
    from pipeline_config.plan import cached_calibration, estimate
    calibration = None if recalibrate else cached_calibration(config)
    if calibration is None and (calibrate or recalibrate):
        from pipeline_config.calibrate import calibrate as measure
        calibration = measure(config, log=log)
    return estimate(config, planned_steps(config), calibration=calibration)


def check_feasible(config, *, warn: Callable[[str], None]) -> Plan:
    """Before a run's first step: refuse (``InfeasiblePlan``, one line naming the fix) what this machine cannot
    hold, warn where it is tight. Closed forms, a cached calibration if there is one, and cheap probes only."""
    from pipeline_config.plan import InfeasiblePlan, feasibility
    plan = build_plan(config, calibrate=False)
    findings = feasibility(config, plan)
    for finding in findings:
        if finding.level == "error":
            raise InfeasiblePlan(finding.message)
        warn(finding.message)
    return plan
