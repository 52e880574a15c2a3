"""What the two-node tests compare between a run split across two nodes and the same run as two processes on one
node: the losses a stage logged step by step (its train_metrics.jsonl) and the arrays an export wrote."""
import json
from pathlib import Path

import numpy as np
import pytest


def losses(stage_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of every logged step of a stage (``train/loss``)."""
    rows = [json.loads(line) for line in (Path(stage_dir) / "train_metrics.jsonl").read_text().splitlines() if line]
    return [(row["step"], row["train/loss"]) for row in rows if "train/loss" in row]


def assert_same_losses(got_dir: Path, expected_dir: Path) -> None:
    """The same steps logged, with the same losses up to float rounding (gloo sums the ranks' gradients in another
    order across nodes than on one)."""
    expected, got = losses(expected_dir), losses(got_dir)
    assert expected, f"{expected_dir} logged no loss"
    assert [step for step, _ in got] == [step for step, _ in expected], got_dir
    assert [loss for _, loss in got] == pytest.approx([loss for _, loss in expected], rel=1e-5, abs=1e-6), got_dir


def exported_arrays(directory: Path) -> dict[str, np.ndarray]:
    """Every .npy (and every array of every .npz) under ``directory``, by its relative path."""
    arrays = {}
    for path in sorted(Path(directory).rglob("*.np[yz]")):
        key = path.relative_to(directory).as_posix()
        if path.suffix == ".npy":
            arrays[key] = np.load(path, allow_pickle=False)
        else:
            with np.load(path, allow_pickle=False) as archive:
                arrays.update({f"{key}:{name}": archive[name] for name in archive.files})
    return arrays


def assert_same_arrays(got_dir: Path, expected_dir: Path) -> None:
    """The same files, float arrays equal up to float rounding (two units in the last place of their dtype: an
    export stored in float16 rounds a weight's last-bit difference to one float16 step), ids and labels exactly."""
    expected, got = exported_arrays(expected_dir), exported_arrays(got_dir)
    assert expected, f"no array under {expected_dir}"
    assert got.keys() == expected.keys(), got_dir
    for key, array in expected.items():
        if np.issubdtype(array.dtype, np.floating):
            rtol = max(1e-5, 2 * float(np.finfo(array.dtype).eps))
            np.testing.assert_allclose(got[key], array, rtol=rtol, atol=1e-6, err_msg=f"{got_dir} {key}")
        else:
            np.testing.assert_array_equal(got[key], array, err_msg=f"{got_dir} {key}")
