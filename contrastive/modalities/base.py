"""What a modality plugs into the one MCL pipeline.

The pipeline (``flows.pipeline``, ``tasks.steps``) owns everything every modality shares: the stage loop, content
keys and caching, k-means and pseudo-labels between stages, the control run, MLflow runs and Prefect artifacts, the
final printout. A modality supplies only what is specific to its data, as plain functions over directories that
return small JSON-able dicts (no Prefect, no MLflow here):

    prepare_data(config)                          -> {"dir", "digest", "num_train", ...}   the data record
    train_spec(config, stage=, ...) / train(spec) -> the stage's model.pt and train_summary.json
    export(config, model_path=, ...)              -> embeddings of the samples MCL clusters (sharded .npy + ids)
    evaluate(config, members=, ...)               -> {metric: value} of one stage or a concatenation of stages
    tables(config, summary)                       -> what `mclpipe run` prints, as (title, rows, metric) tables

Optional parts (a modality leaves them at their defaults when it has no such step): ``regroup`` (CLIP re-writes
its shards sorted by pseudo-label group for cluster-pure batches), ``encode_for_eval`` (CLIP encodes held-out sets
once per model), ``combine_models`` (CLIP's model soup), ``final_metrics`` (text: Hyper-CL on the concatenation),
``diagnose`` (image: embedding diagnostics per stage) and ``serving`` (the registered MLflow model's input).

A new modality is one package ``contrastive/modalities/<name>/`` with ``modality.py`` (``MODALITY``, an instance of
a subclass of :class:`Modality`), ``config.py`` (``CONFIG``, its pipeline config class) and one line in
``contrastive.modalities.registry``;
``contrastive/modalities/embeddings/`` is the smallest example (docs/architecture.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from contrastive.engine.task import StageSpec


@dataclass(frozen=True)
class Member:
    """One stage's representation as an evaluation reads it: its model file, its exported embeddings and (when
    the modality encodes held-out sets per model, ``encode_for_eval``) the features file it wrote."""
    model_path: str
    embeddings_dir: str | None = None
    features: str | None = None


@dataclass(frozen=True)
class ResultsTable:
    """One table of the final printout: ``rows`` {representation: {"<metric>/<column>": value}}; the columns are
    the keys under ``metric/``. ``percent``: values are already in percent (printed with one decimal)."""
    title: str
    rows: dict[str, dict[str, float]]
    metric: str
    percent: bool = False


def table_columns(table: ResultsTable) -> list[str]:
    """The columns of a results table: every key under ``<metric>/`` of any row, sorted."""
    prefix = table.metric + "/"
    return sorted({k.removeprefix(prefix) for m in table.rows.values() for k in m if k.startswith(prefix)})


def format_value(value: float, *, percent: bool) -> str:
    return f"{value:.1f}" if percent else f"{value:.3f}"


def tables_markdown(tables: list[ResultsTable]) -> str:
    """The results tables as markdown (results.md, the Prefect artifact, the parent run's description)."""
    parts = []
    for table in tables:
        columns = table_columns(table)
        lines = [f"### {table.title}", "", "| representation | " + " | ".join(columns) + " |",
                 "|---" * (len(columns) + 1) + "|"]
        for name, metrics in table.rows.items():
            lines.append(f"| {name} | " + " | ".join(
                format_value(metrics.get(f"{table.metric}/{c}", float("nan")), percent=table.percent)
                for c in columns) + " |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


@dataclass(frozen=True)
class ServingInput:
    """What the registered MLflow model of a pipeline takes: numpy dtype name and shape (-1 = any size), and one
    line for its description ("uint8 images (n, H, W, C) or (n, C, H, W)")."""
    dtype: str
    shape: tuple[int, ...]
    description: str
    #: PyPI distributions the model needs where it is loaded (pinned to the versions installed here when logged).
    requirements: tuple[str, ...] = ("torch", "numpy")


@dataclass(frozen=True)
class SweepMetric:
    """The scores a sweep compares across its grid points: the results' ``<prefix>/<column>`` keys, named
    ``label`` on its plots; ``percent``: the values are in percent (else fractions in [0, 1])."""
    prefix: str
    label: str
    percent: bool = False


@dataclass(frozen=True)
class Launch:
    """How a step may run as processes (torchrun, Slurm, Kubernetes): the entry point ``module:function`` those
    processes call with the step's JSON kwargs. None: the step runs in the flow's process only."""
    train_entry: str | None = None
    export_entry: str | None = None
    #: The evaluation sets' encoding (:meth:`Modality.encode_for_eval`): one process, on a cluster a job of its
    #: own (the sets are small; the flow's process may be a login node without a GPU).
    encode_entry: str | None = None


class Modality:
    """Base of every modality (see the module docstring). Subclasses set the class attributes and implement the
    required methods; the optional ones default to "this modality has no such step".

    The ``*_content`` methods return what a step's content key digests (its config sections and the keys of its
    inputs): a step is reused exactly when that content is unchanged, so each includes everything its result
    depends on and nothing else.
    """

    #: The config's ``pipeline:`` key that selects this modality.
    name: ClassVar[str]
    #: A few words for logs and docs: "images", "image-text pairs".
    title: ClassVar[str]
    #: Prefix of this modality's step directories under output_dir/steps ("clip-": clip-train0-<key>).
    step_prefix: ClassVar[str] = ""
    #: Entry points of the steps that can run as several processes.
    launch: ClassVar[Launch] = Launch()
    #: MCL clusters the training split of ``data["dir"]`` and scores the clusters with its attributes
    #: (:meth:`sample_scope`); False: every exported sample, without attributes (CLIP's shards).
    clusters_dataset: ClassVar[bool] = True
    #: The input of the registered MLflow model (None: the pipeline registers no model).
    serving: ClassVar[ServingInput | None] = None
    #: What ``mclpipe sweep`` compares between grid points (default: the linear probe's accuracy per attribute).
    sweep_metric: ClassVar[SweepMetric] = SweepMetric(prefix="probe", label="linear-probe accuracy")

    # ------------------------------------------------------------------------------------------ checks and data
    def preflight(self, config) -> None:
        """Every check that can run before any compute (paths exist, pretrained weights resolve, the capacity rule
        when the data size is known from the config alone); raises ConfigError naming the fix."""

    def prepare_data(self, config, *, log: Callable[[str], None]) -> dict:
        """Write (or find) the data, check the config against its size, return the data record: at least
        ``dir``, ``digest`` and ``num_train``."""
        raise NotImplementedError

    def sample_scope(self, data: dict) -> tuple[np.ndarray | None, dict[str, np.ndarray] | None]:
        """Which samples MCL clusters (ids of the training split, aligned with the export's ids) and their
        attribute labels (to score the clusters), or (None, None): every exported sample, no labels."""
        if not self.clusters_dataset:
            return None, None
        dataset = self.open_dataset(data["dir"])
        train = dataset.indices("train")
        # as the dataset holds them (StringDType for string ids): the clustering steps compare and write them a
        # chunk at a time
        return dataset.ids[train], {name: labels[train] for name, labels in dataset.labels.items()}

    def open_dataset(self, directory: str):
        """The prepared dataset in ``directory`` (a ``contrastive.data.dataset.SampleIndex``: ids, split, labels)."""
        from contrastive.data.loading import load_dataset
        return load_dataset(directory)

    # ------------------------------------------------------------------------------------------ training
    def train_content(self, config, *, stage: int, seed: int, data: dict, batches_key: str | None,
                      inherit_key: str | None) -> dict:
        """What stage ``stage``'s weights depend on (``config`` is that stage's config)."""
        raise NotImplementedError

    def inherits(self, config) -> bool:
        """MCL's stage j + 1 starts from stage j's weights (naive inheritance, the paper's Table 5 ablation)
        instead of a fresh encoder; the control's stages stay fresh. Default: never (every stage is fresh)."""
        return False

    def train_spec(self, config, *, stage: int, seed: int, out_dir: str, data: dict, batches_path: str | None,
                   init_model_path: str | None) -> StageSpec:
        """The typed spec of one stage's training (JSON-able: processes receive it as a file)."""
        raise NotImplementedError

    def stage_fields(self, config, *, seed: int, out_dir: str, data: dict, batches_path: str | None) -> dict:
        """The fields every stage spec over a prepared dataset shares (``dataset_dir``, ``pseudo_labels_path``, the
        batch and its plan, optimizer, loop, device): a modality's :meth:`train_spec` adds its own."""
        t = config.train
        return {"dataset_dir": data["dir"], "stage_dir": out_dir, "pseudo_labels_path": batches_path,
                "batch_size": t.batch_size, "remainder_policy": config.mcl.remainder_policy, "seed": seed,
                "device": config.device, "optim": t.optim_spec(), "loop": t.loop_spec(), "threads": t.threads}

    def train(self, spec: StageSpec, *, callbacks: list) -> dict:
        """Train one stage in this process; returns the train summary (``model_path``, ``final_loss``,
        ``seconds``, ``samples_per_second``, ``trimmed_samples``, ``resumed_from_step``, ``batch_plan``)."""
        raise NotImplementedError

    def train_metrics(self, summary: dict) -> dict[str, float]:
        """The modality's own numbers from a train summary, logged beside the loss (views/s, skipped samples)."""
        return {}

    def train_artifacts(self, config, *, stage: int, out_dir: str) -> list[Path]:
        """Files a finished training leaves besides checkpoints and model (plots), uploaded under ``eval/``."""
        return []

    def total_steps(self, config, *, stage: int, data: dict) -> int:
        """Optimizer steps of one stage (``config`` is that stage's): the progress bar's length."""
        train = config.train
        per_epoch = train.max_steps_per_epoch or max(1, data["num_train"] // config.global_batch_size(stage))
        return train.epochs * per_epoch

    # ------------------------------------------------------------------------------------------ export
    #: Samples per forward pass of the export (the default :meth:`export_kwargs`).
    export_batch_size: ClassVar[int] = 512

    def export_content(self, config, *, train_key: str) -> Any:
        """The export depends on the trained model only (its key holds the data and everything else)."""
        return [f"{self.step_prefix}export", train_key]

    def export_kwargs(self, config, *, model_path: str, data: dict, out_dir: str) -> dict:
        """The JSON kwargs of :meth:`export` (and of ``launch.export_entry`` when it runs as processes)."""
        return {"dataset_dir": data["dir"], "model_path": model_path, "out_dir": out_dir,
                "batch_size": self.export_batch_size, "device": config.device}

    def export(self, **kwargs) -> dict:
        """Embed the samples MCL clusters into ``out_dir`` (sharded .npy + ids): {"dir", "num_samples", "dim",
        ...}; :meth:`export_metrics` picks the numbers to log from it."""
        raise NotImplementedError

    #: Whether :meth:`export` takes ``progress``, called as ``progress(rows, dim)`` after each batch written
    #: (``contrastive.embeddings.compute_embeddings``): what the plan's calibration times a row by, and stops the
    #: export at. False: the export embeds in one pass (text, feature vectors), timed whole.
    export_reports_progress: ClassVar[bool] = False

    def export_metrics(self, result: dict) -> dict[str, float]:
        return {}

    # ------------------------------------------------------------------------------------------ between stages
    def regroup_content(self, config, *, stage: int, seed: int, pseudo_key: str, data: dict) -> Any:
        return None

    def regroup(self, config, *, stage: int, seed: int, pseudo_labels_path: str, data: dict,
                out_dir: str) -> dict | None:
        """Cluster-pure batches of ``stage`` need more than the pseudo-labels file: write it into ``out_dir`` and
        return {"path": what train_spec's ``batches_path`` gets, "stats": {...}}. None (the default): the
        pseudo-labels file is read as it is."""
        return None

    regroups: ClassVar[bool] = False

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_content(self, config, *, member_keys: list[str]) -> Any:
        """The scores depend on the members' models, the eval section and the seed (probe subsets)."""
        return [f"{self.step_prefix}eval", member_keys, config.eval.content(), config.seed]

    def evaluate(self, config, *, members: list[Member], data: dict, out_dir: str) -> dict[str, float]:
        """Metrics of one stage (one member) or of the concatenation of several."""
        raise NotImplementedError

    def cumulative_concat(self, config) -> bool:
        """Also evaluate stages 0..j concatenated for every stage j between the first and the last (learning
        dynamics, the paper's Fig. 5). Default: no (the stages alone and the concatenation of all of them)."""
        return False

    #: The evaluation sets are encoded once per model (:meth:`encode_for_eval`, CLIP) instead of read from the
    #: export.
    encodes_for_eval: ClassVar[bool] = False

    def encode_content(self, config, *, model_key: str, data: dict) -> Any:
        return None

    def encode_kwargs(self, config, *, model_path: str, data: dict, out_dir: str) -> dict:
        """The JSON kwargs of :meth:`encode_for_eval` (and of ``launch.encode_entry`` when it runs as a job)."""
        raise NotImplementedError

    def encode_for_eval(self, **kwargs) -> str:
        """Encode the evaluation sets with one model into ``out_dir``; returns the features file."""
        raise NotImplementedError

    def combines_models(self, config) -> bool:
        """A further representation is made from the stage models (CLIP's model soup) and scored like a stage."""
        return False

    def combine_models(self, *, model_paths: list[str], out_path: str) -> str:
        raise NotImplementedError

    #: Name of the step on the final representation (text: "hyper") whose numbers go beside the results.
    final_name: ClassVar[str | None] = None

    def has_final_step(self, config) -> bool:
        return False

    def final_content(self, config, *, train_keys: list[str]) -> Any:
        return None

    def final_metrics(self, config, *, model_paths: list[str], data: dict, out_dir: str) -> dict:
        """{"metrics": {...}, "artifacts": [paths]} of the step on the final representation."""
        raise NotImplementedError

    #: Embedding diagnostics per stage (:meth:`diagnose`).
    diagnoses: ClassVar[bool] = False

    def diagnose_content(self, config, *, stage: int, export_key: str, clusters_key: str | None) -> Any:
        return None

    def diagnose(self, config, *, stage: int, model_path: str, embeddings_dir: str, clusters_dir: str | None,
                 data: dict, out_dir: str, title: str) -> dict:
        """{"metrics", "plot"} of one stage's embeddings."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ the control run
    def control_config(self, config):
        """The config of the control run (the same number of fresh stages on random batches, concatenated the
        same way), or None when this config has none. The default: the same config, so its stage 0 is MCL's."""
        mcl = config.mcl
        if not getattr(mcl, "control", False) or mcl.num_stages == 1:
            return None
        return config

    def control_label(self, config) -> str:
        return "control"

    # ------------------------------------------------------------------------------------------ reporting
    def tables(self, config, summary: dict) -> list[ResultsTable]:
        """The tables `mclpipe run` prints and the Prefect markdown artifact holds."""
        raise NotImplementedError

    def plots(self, config, *, results: dict[str, dict], out: Path) -> list[Path]:
        """Plots of the whole pipeline's results for the parent run: the probe accuracy per attribute of every
        representation, when there are probe scores."""
        from contrastive.evaluate import plot_attribute_accuracy
        if not any(k.startswith("probe/") for m in results.values() for k in m):
            return []
        return [plot_attribute_accuracy(results=results, path=out / "probe_accuracy.png")]

    # ------------------------------------------------------------------------------------------ serving
    def load_encoder(self, model_path: str) -> Any:
        """One stage's model, ready for :meth:`embed` on the CPU (the registered MLflow model loads it)."""
        raise NotImplementedError

    def serving_file(self, model_path: str, *, out_dir: Path) -> str:
        """A file :meth:`load_encoder` reads without anything from this machine (the stage's model itself, or a
        self-contained copy written into ``out_dir``): what the registered model ships."""
        return model_path

    def embed(self, encoder: Any, inputs: Any) -> np.ndarray:
        """float32 (n, D) embeddings of the inputs ``serving`` describes."""
        raise NotImplementedError
