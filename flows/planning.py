"""The pipeline's steps before it runs, and its plan where users look while it runs.

:func:`planned_steps` runs the flow's own stage loop (``flows.runner.StepRunner``: ``run_stages``, ``run_control``,
``run_combined``, ``run_final``, in the order ``flows.pipeline.mcl_pipeline`` calls them) with a step that records
what it would run instead of running it, so the plan's rows are the steps a run makes, for every modality, and
cannot drift from them. :class:`ProgressRunner` is the runner the flow uses: it publishes the run's plan and, after
every step, updates the flow run's progress artifact (stage i of N, time left by the plan's projections).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from flows.runner import StageRun, StepRunner, step_title
from planning.model import Plan, PlannedStep

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


def planned_results(config, *, data: dict | None = None) -> list[str]:
    """The names of the results a run of ``config`` reports (its tables' rows), in order: stage 0, ..., MCL
    concat, the control's, the combined model's."""
    _, results, _ = run_all(PlanningRunner(config, data=data))
    return list(results)


class ProgressRunner(StepRunner):
    """The flow's runner: the plan of the run published where users look (``tasks.plan_report``: a table artifact,
    ``plan/plan.md`` in MLflow) and, after every step, the flow run's progress (stage i of N, time left)."""

    progress = None  # tasks.plan_report.PlanProgress, set by follow()

    def follow(self) -> Plan:
        """Plan this run (its steps, the cached calibration if there is one: nothing is measured here), publish it
        and report progress from now on."""
        from flows.pipeline_run import pipeline_dir
        from planning.model import cached_calibration, cached_run_costs, estimate
        from tasks.plan_report import PlanProgress, publish_plan
        plan = estimate(self.config, planned_steps(self.config, data=self.data),
                        calibration=cached_calibration(self.config), run_costs=cached_run_costs(self.config))
        publish_plan(config=self.config, plan=plan, tracker=self.tracker, parent_run_id=self.parent_run_id,
                     out_dir=pipeline_dir(self.config))
        self.progress = PlanProgress(plan, stages=self.config.mcl.num_stages)
        return plan

    def step(self, task_fn, *, stage: int | None = None, **kwargs: Any):
        record = super().step(task_fn, stage=stage, **kwargs)
        if self.progress is not None:
            self.progress.step_done(stage=stage)
        return record


def build_plan(config, *, calibrate: bool = True, recalibrate: bool = False,
               log: Callable[[str], None] = print) -> Plan:
    """The plan of ``config`` on this machine: its cached calibration (measured now when there is none and
    ``calibrate``; again with ``recalibrate``) and the machine's cached run costs (the same), the runner's steps,
    their projections."""
    from planning.model import cached_calibration, cached_run_costs, estimate
    calibration = None if recalibrate else cached_calibration(config)
    if calibration is None and (calibrate or recalibrate):
        from planning.calibrate import calibrate as measure
        calibration = measure(config, log=log)
    run_costs = None if recalibrate else cached_run_costs(config)
    if run_costs is None and (calibrate or recalibrate):
        from flows.run_costs import measure_run_costs
        run_costs = measure_run_costs(config, log=log)
    return estimate(config, planned_steps(config), calibration=calibration, run_costs=run_costs)


def check_feasible(config, *, warn: Callable[[str], None]) -> Plan:
    """Before a run's first step: refuse (``InfeasiblePlan``, one line naming the fix) what this machine cannot
    hold, warn where it is tight. Closed forms, a cached calibration if there is one, and cheap probes only."""
    from planning.feasibility import InfeasiblePlan, feasibility
    plan = build_plan(config, calibrate=False)
    findings = feasibility(config, plan)
    for finding in findings:
        if finding.level == "error":
            raise InfeasiblePlan(finding.message)
        warn(finding.message)
    return plan
