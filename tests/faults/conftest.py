"""Fixtures of the fault tests."""
import os
import subprocess

import pytest


def mount_tmpfs(mountpoint, *, size: str) -> None:
    """Mount a tmpfs of ``size`` (needs root; skips the test with the reason otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")


def resize_tmpfs(mountpoint, *, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mountpoint)], check=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1.5 MB tmpfs mounted for the test, unmounted after it."""
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    mount_tmpfs(mountpoint, size="1500k")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=False)
