"""Fixtures of the fault tests."""
import os
import subprocess

import pytest

from tests.components import missing


def mount_tmpfs(mountpoint, *, size: str) -> None:
    """Mount a tmpfs of ``size``. Without the right to (not root, or mount refused: a container without
    CAP_SYS_ADMIN) the test is skipped with the reason, and fails under CI (``CI=true``, as CI services and
    ``.ci/run`` set it): there a skipped full-disk test would leave the slow suite green without having run it."""
    if os.geteuid() != 0:
        _cannot_mount("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        _cannot_mount(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")


def _cannot_mount(reason: str) -> None:
    missing(reason, fix="run CI as root with mount rights (docker run --privileged or --cap-add SYS_ADMIN), or unset "
                        "CI to skip it")


def resize_tmpfs(mountpoint, *, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mountpoint)], check=True)


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a tmpfs of ``size`` mounted for the test (its path), unmounted after it."""
    mounted = []

    def mount(size: str):
        mountpoint = tmp_path / f"disk{len(mounted)}"
        mountpoint.mkdir()
        mount_tmpfs(mountpoint, size=size)
        mounted.append(mountpoint)
        return mountpoint
    yield mount
    for mountpoint in mounted:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


@pytest.fixture
def small_tmpfs(tmpfs):
    """A 1.5 MB tmpfs mounted for the test, unmounted after it."""
    return tmpfs("1500k")
