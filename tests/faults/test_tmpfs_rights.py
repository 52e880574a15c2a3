"""tests/faults/conftest.py's tmpfs: without the right to mount one, a full-disk test skips on a developer's machine
and fails under CI, so CI's slow suite cannot pass without having run them."""
import pytest

from tests.faults import conftest


@pytest.mark.parametrize("ci, outcome", [(None, pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_a_machine_without_the_right_to_mount_skips_and_ci_fails(tmp_path, monkeypatch, ci, outcome):
    monkeypatch.setattr(conftest.os, "geteuid", lambda: 1000)
    monkeypatch.delenv("CI", raising=False)
    if ci:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="mounting a tmpfs needs root"):
        conftest.mount_tmpfs(tmp_path, size="1m")


def test_a_refused_mount_fails_under_ci_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest.os, "geteuid", lambda: 0)
    monkeypatch.setattr(conftest.subprocess, "run", lambda *a, **k: type("Done", (), {
        "returncode": 32, "stderr": "mount: permission denied"})())
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="permission denied; CI=true.*--cap-add SYS_ADMIN"):
        conftest.mount_tmpfs(tmp_path, size="1m")
