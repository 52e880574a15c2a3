import pytest

from tests.slurm import require_slurm


@pytest.fixture(scope="session")
def slurm_cluster():
    return require_slurm()
