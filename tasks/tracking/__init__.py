"""MLflow tracking: the one package that imports mlflow. A reader finds each responsibility in its own module:

- ``client``: :class:`Tracker`, the retrying client of one experiment (runs, params, metrics, artifacts,
  datasets, links to the UI), and what a tracking outage is to this process (:class:`TrackingError`).
- ``journal``: a training stage's metrics on their way to MLflow (:class:`MetricBuffer`, :class:`PendingJournal`
  in ``mlflow-pending.jsonl``), kept through outages and crashes.
- ``serving_model``: the pipeline's MLflow model (:class:`EncoderModel`, :func:`save_encoder`), pickled by value.
- ``registry``: logging that model to a run and the model registry (:func:`log_encoder`, alias ``current``).
- ``relocate``: a local store moved or copied with its run directory points its artifact locations at the new
  place (the client calls it when it opens the store).

Import from ``tasks.tracking``; the names below are its public API.
"""
from tasks.tracking.client import (EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, PENDING_FILE, TRAINING_VIEW, RunState,
                                   Tracker, TrackingAway, TrackingError, default_tracking_uri, flatten, is_remote,
                                   metric_points, now_ms, ui_base, ui_command)
from tasks.tracking.journal import MetricBuffer, PendingJournal, rank_metric_points
from tasks.tracking.registry import MODEL_ALIAS, log_encoder
from tasks.tracking.serving_model import EncoderModel, save_encoder, serving_requirements

__all__ = ["EXPERIMENT_KIND", "EXPERIMENT_KIND_TAG", "MODEL_ALIAS", "PENDING_FILE", "TRAINING_VIEW", "EncoderModel",
           "MetricBuffer", "PendingJournal", "RunState", "Tracker", "TrackingAway", "TrackingError",
           "default_tracking_uri", "flatten", "is_remote", "log_encoder", "metric_points", "now_ms",
           "rank_metric_points", "save_encoder", "serving_requirements", "ui_base", "ui_command"]
