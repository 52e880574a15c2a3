import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import pytest  # noqa: E402

from pipeline_config.loader import load_config  # noqa: E402


@pytest.fixture
def tiny_config(tmp_path):
    """The seconds-long preset, writing everything (data, steps, MLflow db and artifacts) under tmp_path."""
    def make(*overrides: str):
        return load_config("trifeature_tiny", [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'data'}",
                                               f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", *overrides])
    return make
