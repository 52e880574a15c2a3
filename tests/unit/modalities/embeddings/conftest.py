import pytest


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread):
    """Every embeddings test trains or runs a tiny model: one torch thread (``one_thread``, tests/unit/modalities)."""
