import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core machine: one torch thread is several times faster than oversubscribing."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
