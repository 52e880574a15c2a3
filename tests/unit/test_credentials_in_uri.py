"""A password in the tracking URI would be logged with the config (MLflow params, Prefect parameters, links):
refused with one line that says where credentials go instead (issue 36)."""
import pytest
from pydantic import ValidationError

from contrastive.errors import ConfigError
from pipeline_config.schema import TrackingConfig


@pytest.mark.parametrize("uri", ["http://admin:s3cret@mlflow.example.org:5000", "https://token@mlflow.example.org",
                                 "postgresql+psycopg2://mclpipe:s3cret@db:5432/mlflow"])
def test_a_tracking_uri_with_credentials_is_refused(uri):
    with pytest.raises(ValidationError, match="tracking.uri must not hold a user or password") as info:
        TrackingConfig(uri=uri)
    assert "MLFLOW_TRACKING_PASSWORD" in str(info.value) and "s3cret" not in str(info.value)


@pytest.mark.parametrize("uri", [None, "http://127.0.0.1:5000", "https://mlflow.example.org",
                                 "sqlite:////shared/mlflow.db", "postgresql+psycopg2://mclpipe@db:5432/mlflow"])
def test_a_tracking_uri_without_credentials_is_kept(uri):
    assert TrackingConfig(uri=uri).uri == uri


def test_the_environment_uri_is_refused_before_any_request(monkeypatch):
    from tasks.tracking import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://admin:s3cret@127.0.0.1:9")  # nothing listens on port 9
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_URI must not hold a user or password"):
        Tracker(uri=None, experiment="x", retries=0)
