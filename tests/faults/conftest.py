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
