"""Host synchronisations per training step (issue 24): on a GPU every read of a device tensor on the host
(``.item()``, ``bool()``, ``float()``, ``.tolist()``) waits for the queued kernels. Outside logging steps the loop
makes one per step (the non-finite check); counted here on the CPU by patching those reads, with the counter
`make gpu-check` uses on a GPU (bench/gpu_check.py)."""
import pytest
import torch

from bench.gpu_check import host_reads_per_step


@pytest.mark.parametrize("accumulation", [1, 3])
def test_one_host_read_per_step_outside_logging(accumulation):
    steps = 20
    per_step = host_reads_per_step(device=torch.device("cpu"), steps=steps, accumulation=accumulation)
    # one per step, plus the epoch's end (its mean loss, the last loss): the loop's own reads are all counted
    assert 1.0 <= per_step <= 1.0 + 2 / steps
