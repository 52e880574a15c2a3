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


@dataclass(frozen=True)
class ServingInput:
    """What the registered MLflow model of a pipeline takes: numpy dtype name and shape (-1 = any size), and one
    line for its description ("uint8 images (n, H, W, C) or (n, C, H, W)")."""
    dtype: str
    shape: tuple[int, ...]
    description: str


@dataclass(frozen=True)
class Launch:
    """How a step may run as processes (torchrun, Slurm, Kubernetes): the entry point ``module:function`` those
    processes call with the step's JSON kwargs. None: the step runs in the flow's process only."""
    train_entry: str | None = None
    export_entry: str | None = None


class Modality:
    """Base of every modality (see the module docstring). Subclasses set the class attributes and implement the
    required methods; the optional ones default to "this modality has no such step"."""

    #: The config's ``pipeline:`` key that selects this modality (``mcl`` is the image modality's, for history).
    name: ClassVar[str]
    #: A few words for logs and docs: "images", "image-text pairs".
    title: ClassVar[str]
    #: Entry points of the steps that can run as several processes.
    launch: ClassVar[Launch] = Launch()
    #: MCL clusters the training split of ``data["dir"]`` (ids and attributes from it); False: every exported
    #: sample, without attributes (CLIP's shards).
    clusters_dataset: ClassVar[bool] = True
    #: Name of the MLflow model version a pipeline registers ("mcl-representation").
    model_name: ClassVar[str] = "mcl-representation"

    # ------------------------------------------------------------------------------------------ checks and data
    def preflight(self, config) -> None:
        """Every check that can run before any compute (paths exist, pretrained weights resolve, the capacity rule
        when the data size is known from the config alone); raises ConfigError naming the fix."""

    def prepare_data(self, config, *, log: Callable[[str], None]) -> dict:
        """Write (or find) the data, check the config against its size, return the data record: at least
        ``dir`` (what MCL clusters when ``clusters_dataset``), ``digest``, ``num_train``."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ training
    def train_content(self, config, *, stage: int, seed: int, data: dict, batches_key: str | None) -> dict:
        """What a stage's weights depend on (digested into its content key): the stage's config sections, seed,
        data digest, the key of what its cluster-pure batches come from."""
        raise NotImplementedError

    def train_spec(self, config, *, stage: int, seed: int, out_dir: str, data: dict, batches_path: str | None,
                   init_model_path: str | None) -> StageSpec:
        """The typed spec of one stage's training (JSON-able: processes receive it as a file)."""
        raise NotImplementedError

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
        """Optimizer steps of one stage (the progress bar's length)."""
        train = config.for_stage(stage).train
        return train.epochs * (train.max_steps_per_epoch or max(1, data["num_train"] // config.global_batch_size(stage)))

    # ------------------------------------------------------------------------------------------ export
    def export_content(self, config) -> Any:
        """What an export depends on besides the trained model (digested into its key)."""
        return None

    def export_kwargs(self, config, *, model_path: str, data: dict, out_dir: str) -> dict:
        """The JSON kwargs of :meth:`export` (and of ``launch.export_entry`` when it runs as processes)."""
        raise NotImplementedError

    def export(self, **kwargs) -> dict:
        """Embed the samples MCL clusters into ``out_dir`` (sharded .npy + ids): {"dir", "num_samples", "dim",
        "metrics"}."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ between stages
    def regroup_content(self, config, *, stage: int) -> Any:
        return None

    def regroup(self, config, *, stage: int, seed: int, pseudo_labels_path: str, data: dict, out_dir: str) -> dict | None:
        """Cluster-pure batches of ``stage`` need more than the pseudo-labels file: write it into ``out_dir`` and
        return {"path": what train_spec's ``batches_path`` gets, "metrics": {...}}. None: the pseudo-labels file is
        read as it is (the default)."""
        return None

    # ------------------------------------------------------------------------------------------ evaluation
    def eval_content(self, config) -> Any:
        """What an evaluation depends on besides its members' keys."""
        raise NotImplementedError

    def encode_for_eval(self, config, *, model_path: str, data: dict, out_dir: str) -> str | None:
        """Encode the evaluation sets once per model (CLIP); returns the features file. None (default): the
        evaluation reads the exported embeddings."""
        return None

    encodes_for_eval: ClassVar[bool] = False

    def encode_content(self, config) -> Any:
        return None

    def evaluate(self, config, *, members: list[Member], data: dict, out_dir: str) -> dict[str, float]:
        """Metrics of one stage (one member) or of the concatenation of several."""
        raise NotImplementedError

    def combine_models(self, config, *, model_paths: list[str], out_path: str) -> str | None:
        """A further representation made from the stage models (CLIP's model soup), scored like a stage; None:
        none for this config."""
        return None

    def final_metrics(self, config, *, model_paths: list[str], data: dict, out_dir: str) -> dict[str, float] | None:
        """A step on the final representation whose numbers go beside the results (text: Hyper-CL); None: none."""
        return None

    def final_content(self, config) -> Any:
        return None

    def diagnose(self, config, *, stage: int, model_path: str, embeddings_dir: str, clusters_dir: str | None,
                 data: dict, out_dir: str, title: str) -> dict | None:
        """Embedding diagnostics of one stage: {"metrics", "plot"} (image); None: none."""
        return None

    diagnoses: ClassVar[bool] = False

    def diagnose_content(self, config, *, stage: int) -> Any:
        return None

    # ------------------------------------------------------------------------------------------ the control run
    def control_config(self, config):
        """The config of the control run (the same number of fresh stages on random batches), or None when this
        config has none. The default: the same config, whose stage 0 is MCL's own."""
        mcl = config.mcl
        if not getattr(mcl, "control", False) or mcl.num_stages == 1:
            return None
        return config

    # ------------------------------------------------------------------------------------------ reporting
    def tables(self, config, summary: dict) -> list[ResultsTable]:
        """The tables `mclpipe run` prints and the Prefect markdown artifact holds."""
        raise NotImplementedError

    def plots(self, *, results: dict[str, dict], out: Path) -> list[Path]:
        """Plots of the whole pipeline's results for the parent run."""
        return []

    # ------------------------------------------------------------------------------------------ serving
    serving: ClassVar[ServingInput | None] = None

    def load_encoder(self, model_path: str) -> Any:
        """One stage's model, ready for :meth:`embed` on the CPU (the registered MLflow model loads it)."""
        raise NotImplementedError

    def embed(self, encoder: Any, inputs: Any) -> np.ndarray:
        """float32 (n, D) embeddings of the inputs ``serving`` describes."""
        raise NotImplementedError
