"""User-facing errors. Every message says what went wrong and how to fix it; the CLI prints it on one line."""


class MclpipeError(Exception):
    """Base class for mistakes a user can make (bad config, missing data, corrupt files)."""


class ConfigError(MclpipeError):
    """The pipeline configuration is invalid."""


class DataError(MclpipeError):
    """Input data is missing, corrupt, or inconsistent with what was computed earlier."""
