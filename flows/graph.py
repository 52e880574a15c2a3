"""The pipeline's stage graph as data: every step a run of a config makes, in the flow's order, as a typed
:class:`StepSpec` (which step: a frozen :class:`StepId`; the Prefect task; its inputs; its content key; the MLflow
run it logs into). Two readers walk the same list: the runner executes it (``flows.runner.StepRunner.run_graph``:
caching, the step lock, MLflow) and the planner projects it (``flows.plan_steps.planned_steps``), so a plan cannot
drift from the run.

    for stage j:  train (fresh encoder; cluster-pure batches for j >= 1) -> export -> evaluate stage j alone
                  if j is not the last: k-means on stage j -> pseudo-labels combine(y_0..y_j) -> batches of j + 1
    then:         evaluate the concatenation of all stages; the control run; the combined model; the final step

A step's inputs name earlier steps' records by :class:`Ref` (and an evaluation's members by :class:`MemberRef`),
resolved by the runner when it gets there; content keys digest earlier steps' keys, known here without running
anything. Titles, progress lines and the step's words in errors are rendered from the :class:`StepId`
(:func:`step_title`), never parsed back from a string.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from contrastive.modalities.base import Member
from pipeline_config.schema import digest_of
from tasks import steps as t

_KIND_LABELS = {"mcl": "MCL", "control": "control"}
_STEP_VERBS = {"train": "train", "export": "export", "cluster": "k-means", "regroup": "regroup batches for",
               "soup": "model soup", "hyper": "Hyper-CL"}
_EVAL_VERBS = {"eval": "probe", "encode": "encode", "diagnose": "diagnose"}


@dataclass(frozen=True)
class StageRun:
    """The MLflow run of one stage of one kind (mcl, control), opened when a step first logs into it
    (``flows.runner``)."""
    kind: str
    stage: int

    @property
    def label(self) -> str:
        return f"{self.kind} stage {self.stage}"


@dataclass(frozen=True)
class Rep:
    """A representation an evaluation, encoding or diagnosis reads: one stage's model (``stage``), the
    concatenation of a kind's stages (``concat``; ``upto``: stages 0..upto only, the learning dynamics), or the
    combined model (kind ``soup``)."""
    kind: str
    stage: int | None = None
    concat: bool = False
    upto: int | None = None

    @property
    def name(self) -> str:
        """The name tasks and step directories know it by: stage1, control_stage2, mcl_concat_0_1, mcl_concat,
        control_concat, soup."""
        if self.kind == "soup":
            return "soup"
        if self.concat:
            return f"{self.kind}_concat" + (f"_0_{self.upto}" if self.upto is not None else "")
        return f"stage{self.stage}" if self.kind == "mcl" else f"{self.kind}_stage{self.stage}"

    @property
    def label(self) -> str:
        """For people: stage 1, MCL concat of stages 0-1, MCL concat, control concat, soup."""
        if self.kind == "soup":
            return "soup"
        if self.concat:
            span = f" of stages 0-{self.upto}" if self.upto is not None else ""
            return f"{_KIND_LABELS.get(self.kind, self.kind)} concat{span}"
        return f"stage {self.stage}"


@dataclass(frozen=True)
class StepId:
    """Which step: ``what`` it does (train, export, cluster, pseudo_labels, regroup, soup, the modality's final
    step, eval, encode, diagnose), of which ``stage`` (None: of none, or of the representation ``of``), in which
    ``kind`` of run (mcl, control; pipeline: a step of the parent run), and for an evaluation, encoding or
    diagnosis, ``of`` which representation."""
    stage: int | None
    kind: str
    what: str
    of: Rep | None = None

    @property
    def name(self) -> str:
        """The step's name as plans and records say it: train, eval.stage1, encode.soup, ..."""
        return f"{self.what}.{self.of.name}" if self.of is not None else self.what


@dataclass(frozen=True)
class Ref:
    """An earlier step's record as a step's input (``attr``: one field of it), resolved by the runner."""
    step: StepId
    attr: str | None = None


@dataclass(frozen=True)
class MemberRef:
    """One member of an evaluation: a model and its export, or its encoding of the evaluation sets."""
    model: StepId
    embeddings: StepId | None = None
    features: StepId | None = None


@dataclass
class StepSpec:
    """One step of the graph: its id, the Prefect task, the config it is called with (a control that is a variant of
    the config calls with the variant), its content key and directory name, its inputs (``Ref``/``MemberRef``
    resolved when it runs), the MLflow run it logs into (None: the parent run), ``reads_stage`` (for a step of no
    stage of its own: the latest stage whose outputs it reads; a rerun from it recomputes the step), ``for_stage``
    (pseudo-labels: the stage that trains on them) and ``result`` (the results row its metrics become)."""
    id: StepId
    task: Any
    config: Any
    key: str
    prefix: str
    inputs: dict[str, Any]
    run: StageRun | None = None
    reads_stage: int | None = None
    for_stage: int | None = None
    result: str | None = None
    members: int = 1

    @property
    def step_dir(self) -> str:
        """Its directory under output_dir/steps."""
        return f"{self.prefix}-{self.key}"

    @property
    def latest_stage(self) -> int | None:
        """The latest stage whose outputs the step reads (what ``rerun_from`` compares)."""
        return self.id.stage if self.reads_stage is None else self.reads_stage

    @property
    def title(self) -> str:
        return step_title(self.id, run=self.run, for_stage=self.for_stage)

    @property
    def words(self) -> str:
        """The step in an error line: "the train step of stage 1"."""
        return f"the {self.id.name} step" + (f" of stage {self.id.stage}" if self.id.stage is not None else "")


def step_title(step: StepId, *, run: StageRun | None, for_stage: int | None = None) -> str:
    """The name of a step's Prefect task run, so the flow graph reads like the pipeline: ``train stage 1 (MCL)``,
    ``k-means stage 0``, ``pseudo-labels for stage 2``, ``probe MCL concat``, ``probe stage 1 (control)``. Stage 0
    is shared by MCL and its control: it names no kind (its k-means logs into MCL stage 1's run)."""
    step_stage = step.stage if step.stage is not None else (run.stage if run is not None else 0)
    kind = f" ({_KIND_LABELS.get(run.kind, run.kind)})" if run is not None and step_stage > 0 else ""
    if step.what == "pseudo_labels":
        return f"pseudo-labels for stage {for_stage}"
    if step.of is not None:
        rep = step.of
        suffix = " (control)" if rep.kind == "control" and not rep.concat else \
            kind if rep.kind == "mcl" and not rep.concat else ""
        return f"{_EVAL_VERBS.get(step.what, step.what)} {rep.label}{suffix}"
    where = f" stage {step.stage}" if step.stage is not None else ""
    return f"{_STEP_VERBS.get(step.what, step.what)}{where}{kind}"


@dataclass
class StageGraph:
    """Every step of a run in order, and which of them the pipeline's summary reads: MCL's trainings, exports and
    k-means per stage, and the final step."""
    steps: list[StepSpec] = field(default_factory=list)
    trained: list[StepId] = field(default_factory=list)
    exports: list[StepId] = field(default_factory=list)
    clusters: list[StepId] = field(default_factory=list)
    final: StepId | None = None


class _Builder:
    """Builds the graph of one config (the control's variant config builds its own part with a builder of its own,
    appending to the same graph)."""

    def __init__(self, config, *, data: dict, graph: StageGraph):
        self.config = config
        self.data = data
        self.graph = graph
        self.modality = t.modality_of(config)
        self.prefix = self.modality.step_prefix
        self.mcl_trained: dict[int, StepSpec] = {}  # what an inheriting stage j + 1 starts from

    def add(self, *, task, what: str, prefix: str, content: Any, run: StageRun | None, stage: int | None = None,
            of: Rep | None = None, **fields: Any) -> StepSpec:
        kind = run.kind if run is not None else "pipeline"
        spec = StepSpec(id=StepId(stage=stage, kind=kind, what=what, of=of), task=task, config=self.config,
                        key=digest_of(content), prefix=prefix, run=run, **fields)
        self.graph.steps.append(spec)
        return spec

    # ------------------------------------------------------------------------------------------ one stage
    def train_and_export(self, *, kind: str, stage: int,
                         batches: StepSpec | None) -> tuple[StepSpec, StepSpec]:
        """Train stage ``stage`` (random batches when ``batches`` is None) and export its embeddings."""
        run = StageRun(kind, stage)
        # Naive inheritance (paper Table 5) applies to MCL's stages only; the control stays fresh stages.
        init_from = self.mcl_trained.get(stage - 1) if kind == "mcl" and self.modality.inherits(self.config) else None
        content = self.modality.train_content(
            self.config.for_stage(stage), stage=stage, seed=t.stage_seed(self.config, stage), data=self.data,
            batches_key=batches.key if batches else None, inherit_key=init_from.key if init_from else None)
        inputs = {"data": self.data, "batches": Ref(batches.id) if batches else None,
                  **({"init_from": Ref(init_from.id)} if init_from is not None else {})}
        trained = self.add(task=t.train_stage, what="train", prefix=f"{self.prefix}train{stage}", content=content,
                           run=run, stage=stage, inputs=inputs)
        if kind == "mcl":
            self.mcl_trained[stage] = trained
        exported = self.add(task=t.export_embeddings, what="export", prefix=f"{self.prefix}export{stage}",
                            content=self.modality.export_content(self.config, train_key=trained.key), run=run,
                            stage=stage, inputs={"trained": Ref(trained.id), "data": self.data})
        return trained, exported

    def member(self, *, rep: Rep, model: StepSpec, exported: StepSpec | None, run: StageRun | None,
               stage: int) -> tuple[str, MemberRef]:
        """(key, member) of one representation as evaluations read it: its export, or, for a modality that encodes
        the evaluation sets once per model, that encoding. ``stage``: the latest stage the model is made from."""
        if not self.modality.encodes_for_eval:
            return exported.key, MemberRef(model=model.id, embeddings=exported.id)
        features = self.add(
            task=t.encode_for_eval, what="encode", prefix=f"{self.prefix}encode", of=rep, run=run, reads_stage=stage,
            content=self.modality.encode_content(self.config, model_key=model.key, data=self.data),
            inputs={"name": rep.name, "model_path": Ref(model.id, "model_path"), "data": self.data})
        return features.key, MemberRef(model=model.id, features=features.id)

    def evaluate(self, *, rep: Rep, members: list[tuple[str, MemberRef]], run: StageRun | None,
                 stage: int | None = None, reads_stage: int | None = None, result: str) -> StepSpec:
        """The metrics of one representation (one member) or of the concatenation of several: results row
        ``result``."""
        return self.add(task=t.evaluate, what="eval", prefix=f"{self.prefix}eval", of=rep, run=run, stage=stage,
                        content=self.modality.eval_content(self.config, member_keys=[k for k, _ in members]),
                        reads_stage=reads_stage, result=result, members=len(members),
                        inputs={"name": rep.name, "members": [m for _, m in members], "data": self.data})

    def diagnose(self, *, rep: Rep, stage: int, trained: StepSpec, exported: StepSpec, clusters: StepSpec | None,
                 run: StageRun) -> None:
        """Embedding diagnostics of one stage, for a modality that has them."""
        if not self.modality.diagnoses:
            return
        content = self.modality.diagnose_content(self.config, stage=stage, export_key=exported.key,
                                                 clusters_key=clusters.key if clusters else None)
        self.add(task=t.diagnose, what="diagnose", prefix="diag", of=rep, run=run, stage=stage, content=content,
                 inputs={"name": rep.name, "trained": Ref(trained.id), "exported": Ref(exported.id),
                         "clusters": Ref(clusters.id) if clusters else None, "data": self.data})

    # ------------------------------------------------------------------------------------------ between stages
    def cluster(self, *, stage: int, exported: StepSpec, earlier: list[StepSpec], run: StageRun) -> StepSpec:
        """k-means on stage ``stage``'s export."""
        spec = self.config.mcl.kmeans_spec(stage, seed=t.stage_seed(self.config, stage))
        content = ["cluster", exported.key, asdict(spec), self.modality.clusters_dataset, [c.key for c in earlier]]
        return self.add(task=t.cluster_embeddings, what="cluster", prefix=f"cluster{stage}", content=content, run=run,
                        stage=stage, inputs={"exported": Ref(exported.id), "earlier": [Ref(c.id) for c in earlier],
                                             "data": self.data})

    def pseudo_labels(self, *, for_stage: int, clusters: list[StepSpec], exports: list[StepSpec],
                      run: StageRun) -> StepSpec:
        """Pseudo-labels of ``for_stage`` from ALL earlier stages' clusterings."""
        content = ["pseudo", [c.key for c in clusters], self.config.mcl.small_group_policy,
                   self.config.global_batch_size(for_stage)]
        return self.add(task=t.make_pseudo_labels, what="pseudo_labels", prefix=f"pseudo{for_stage}",
                        content=content, run=run, stage=for_stage - 1, for_stage=for_stage,
                        inputs={"for_stage": for_stage, "clusters": [Ref(c.id) for c in clusters],
                                "exports": [Ref(e.id) for e in exports], "data": self.data})

    def batches_for(self, *, stage: int, pseudo: StepSpec, run: StageRun) -> StepSpec:
        """What cluster-pure stage ``stage`` reads: the pseudo-labels, or what the modality regroups from them."""
        if not self.modality.regroups:
            return pseudo
        content = self.modality.regroup_content(self.config, stage=stage, seed=t.stage_seed(self.config, stage),
                                                pseudo_key=pseudo.key, data=self.data)
        return self.add(task=t.regroup_batches, what="regroup", prefix=f"{self.prefix}grouped{stage}",
                        content=content, run=run, stage=stage, inputs={"pseudo": Ref(pseudo.id), "data": self.data})

    # ------------------------------------------------------------------------------------------ the loop
    def stages(self) -> list[tuple[str, MemberRef]]:
        """MCL's stage loop; every later stage trains a fresh encoder on cluster-pure batches. Returns the stages'
        members."""
        graph, stages, batches = self.graph, self.config.mcl.num_stages, None
        members: list[tuple[str, MemberRef]] = []
        exports: list[StepSpec] = []
        clusters: list[StepSpec] = []
        for stage in range(stages):
            run = StageRun("mcl", stage)
            trained, exported = self.train_and_export(kind="mcl", stage=stage, batches=batches)
            graph.trained.append(trained.id)
            graph.exports.append(exported.id)
            exports.append(exported)
            member = self.member(rep=Rep("mcl", stage), model=trained, exported=exported, run=run, stage=stage)
            members.append(member)
            self.evaluate(rep=Rep("mcl", stage), members=[member], run=run, stage=stage, result=f"stage {stage}")
            if stage + 1 < stages:
                # What stage + 1 trains on is logged in its run: the k-means of this stage, the pseudo-labels.
                next_run = StageRun("mcl", stage + 1)
                clusters.append(self.cluster(stage=stage, exported=exported, earlier=list(clusters), run=next_run))
                graph.clusters.append(clusters[-1].id)
                pseudo = self.pseudo_labels(for_stage=stage + 1, clusters=list(clusters), exports=list(exports),
                                            run=next_run)
                batches = self.batches_for(stage=stage + 1, pseudo=pseudo, run=next_run)
            self.diagnose(rep=Rep("mcl", stage), stage=stage, trained=trained, exported=exported,
                          clusters=clusters[stage] if stage < len(clusters) else None, run=run)
            if self.modality.cumulative_concat(self.config) and 0 < stage < stages - 1:
                # Learning dynamics (paper Fig. 5): stages 0..j concatenated; the last j is "MCL concat" itself.
                self.evaluate(rep=Rep("mcl", concat=True, upto=stage), members=members[:stage + 1], run=run,
                              stage=stage, result=f"MCL concat 0-{stage}")
        if stages > 1:
            self.evaluate(rep=Rep("mcl", concat=True), members=members, run=None, stage=stages - 1,
                          result="MCL concat")
        return members

    def control(self, mcl_members: list[tuple[str, MemberRef]]) -> None:
        """The control run: the same number of fresh stages on ordinary random batches, concatenated the same way.
        Its stage 0 *is* MCL's stage 0, unless the modality's control is a variant of the config (a HEX pipeline's
        control is the same method without HEX): then it retrains, and reports, every stage."""
        control_config = self.modality.control_config(self.config)
        if control_config is None:
            return
        variant = control_config is not self.config
        control = _Builder(control_config, data=self.data, graph=self.graph) if variant else self
        label = self.modality.control_label(self.config)
        members = [] if variant else [mcl_members[0]]
        stages = self.config.mcl.num_stages
        for stage in range(len(members), stages):
            run = StageRun("control", stage)
            trained, exported = control.train_and_export(kind="control", stage=stage, batches=None)
            member = control.member(rep=Rep("control", stage), model=trained, exported=exported, run=run, stage=stage)
            members.append(member)
            control.diagnose(rep=Rep("control", stage), stage=stage, trained=trained, exported=exported,
                             clusters=None, run=run)
            if variant:
                control.evaluate(rep=Rep("control", stage), members=[member], run=run, stage=stage,
                                 result=f"{label} stage {stage}")
        if stages > 1:
            control.evaluate(rep=Rep("control", concat=True), members=members, run=None, stage=stages - 1,
                             result=f"{label} concat")

    def combined(self) -> None:
        """The representation the modality makes from the stage models (CLIP's model soup), scored like a stage."""
        if self.config.mcl.num_stages == 1 or not self.modality.combines_models(self.config):
            return
        trained = [self.mcl_trained[stage] for stage in sorted(self.mcl_trained)]
        last = len(trained) - 1
        soup = self.add(task=t.combine_models, what="soup", prefix=f"{self.prefix}soup", run=None, reads_stage=last,
                        content=[f"{self.prefix}soup", [x.key for x in trained]], members=len(trained),
                        inputs={"trained": [Ref(x.id) for x in trained]})
        member = self.member(rep=Rep("soup"), model=soup, exported=None, run=None, stage=last)
        self.evaluate(rep=Rep("soup"), members=[member], run=None, reads_stage=last, result="soup")

    def final(self) -> None:
        """The modality's step on the final representation (text: Hyper-CL on the concatenation of every stage)."""
        if not self.modality.has_final_step(self.config):
            return
        trained = [self.mcl_trained[stage] for stage in sorted(self.mcl_trained)]
        name = self.modality.final_name
        spec = self.add(task=t.final_metrics, what=name, prefix=f"{self.prefix}{name}", run=None,
                        content=self.modality.final_content(self.config, train_keys=[x.key for x in trained]),
                        reads_stage=len(trained) - 1, members=len(trained),
                        inputs={"trained": [Ref(x.id) for x in trained], "data": self.data})
        self.graph.final = spec.id


def stage_graph(config, *, data: dict) -> StageGraph:
    """Every step after the data is prepared, in the flow's order: MCL's stages, the control, the combined model,
    the final step. ``data``: the prepared data's record (its digest is in every key)."""
    graph = StageGraph()
    builder = _Builder(config, data=data, graph=graph)
    members = builder.stages()
    builder.control(members)
    builder.combined()
    builder.final()
    return graph


def resolve_inputs(inputs: dict[str, Any], records: dict[StepId, Any]) -> dict[str, Any]:
    """A step's inputs as its task takes them: every :class:`Ref` replaced by the record it names (or the record's
    field) and every :class:`MemberRef` by the :class:`Member` it describes, in lists too."""
    return {name: _resolved(value, records) for name, value in inputs.items()}


def _resolved(value: Any, records: dict[StepId, Any]) -> Any:
    if isinstance(value, Ref):
        record = records[value.step]
        return getattr(record, value.attr) if value.attr else record
    if isinstance(value, MemberRef):
        model = records[value.model].model_path
        if value.features is not None:
            return Member(model_path=model, features=records[value.features].features)
        return Member(model_path=model, embeddings_dir=records[value.embeddings].embeddings_dir)
    if isinstance(value, list):
        return [_resolved(item, records) for item in value]
    return value
