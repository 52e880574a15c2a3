"""User-facing errors. Every message says what went wrong and how to fix it; the CLI prints it on one line."""


class MclpipeError(Exception):
    """Base class for mistakes a user can make (bad config, missing data, corrupt files)."""


class ConfigError(MclpipeError, ValueError):
    """The pipeline configuration is invalid. A ValueError too, so the config schema reports one raised while it
    validates a library spec (whose checks live in the spec's ``__post_init__``) as a validation error."""


class DataError(MclpipeError):
    """Input data is missing, corrupt, or inconsistent with what was computed earlier."""
