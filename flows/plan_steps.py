"""The pipeline's steps before it runs, and its plan where users look while it runs.

:func:`planned_steps` reads the stage graph the flow executes (``flows.graph.stage_graph``: every step with its
``StepId``, content key and MLflow run), so the plan's rows are the steps a run makes, for every modality, and cannot
drift from them; nothing runs and nothing stands in for a record. :class:`ProgressRunner` is the runner the flow
uses: it publishes the run's plan and, after every step, updates the flow run's progress artifact (stage i of N,
time left by the plan's projections).
"""
from __future__ import annotations

from typing import Callable

from flows.graph import StageGraph, StepSpec, stage_graph
from flows.runner import StepRunner
from planning.model import Plan, PlannedStep

PREPARE = PlannedStep(what="prepare", title="prepare data")
#: What a plan's step keys read of the prepared data before it is prepared (its digest stands in).
PLACEHOLDER_DATA = {"dir": "<planned>", "digest": "planned", "num_train": 0}


def planned(spec: StepSpec) -> PlannedStep:
    """One step of the graph as the planner reads it."""
    return PlannedStep(what=spec.id.name, title=spec.title, stage=spec.id.stage, kind=spec.id.kind,
                       members=spec.members, step_dir=spec.step_dir, run=spec.run.label if spec.run else None)


def run_all(runner: StepRunner):
    """Every step after the data is prepared, in the flow's order: (stage outputs, results, final metrics)."""
    return runner.run_graph(stage_graph(runner.config, data=runner.data))


def planned_graph(config, *, data: dict | None = None) -> StageGraph:
    """The graph a run of ``config`` executes; with the prepared data's record (``data``), each step's directory
    is the one the run writes it to (its content key holds the data's digest), else a placeholder digest stands
    in."""
    return stage_graph(config, data=data or PLACEHOLDER_DATA)


def planned_steps(config, *, data: dict | None = None) -> list[PlannedStep]:
    """The steps a run of ``config`` makes, in order: the data's preparation, then the graph's."""
    return [PREPARE, *(planned(spec) for spec in planned_graph(config, data=data).steps)]


def planned_results(config, *, data: dict | None = None) -> list[str]:
    """The names of the results a run of ``config`` reports (its tables' rows), in order: stage 0, ..., MCL
    concat, the control's, the combined model's."""
    return [spec.result for spec in planned_graph(config, data=data).steps if spec.result is not None]


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

    def step(self, spec: StepSpec):
        record = super().step(spec)
        if self.progress is not None:
            self.progress.step_done(stage=spec.id.stage)
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
