"""Credentials never travel in a tracking URI: the config is logged as MLflow params and stored as a Prefect flow
run's parameters, and the URI ends up in links, so a password in it would be written wherever the config goes."""
from __future__ import annotations

from urllib.parse import urlsplit

from contrastive.errors import ConfigError


def refuse_credentials_in_uri(uri: str | None, *, name: str) -> str | None:
    """``uri`` unchanged when it holds no password (nor, for http(s), a user, which may be a token); else a
    ConfigError (a ValueError) naming ``name`` (where the URI came from) and where the credentials go instead."""
    if not uri:
        return uri
    parts = urlsplit(uri)
    if parts.password is not None or (parts.scheme in ("http", "https") and parts.username):
        raise ConfigError(f"{name} must not hold a user or password (it is logged with the run): remove them and set "
                         "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in the environment for an MLflow "
                         "server, or PGPASSWORD / ~/.pgpass for a database")
    return uri
