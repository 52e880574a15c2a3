"""Pure library for multistage contrastive learning (MCL) and HEX.

Nothing in this package imports Prefect or MLflow: orchestration lives in ``tasks/`` and ``flows/``.
"""
from contrastive.errors import MclpipeError, DataError, ConfigError

__all__ = ["MclpipeError", "DataError", "ConfigError"]
