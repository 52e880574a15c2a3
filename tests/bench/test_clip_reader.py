"""The CLIP reading-process benchmark's bookkeeping (bench/clip_reader.py): CPU a sample of the reading process
against open_clip's at each worker count, the worst count deciding (the benchmark itself runs in `make bench`)."""
from bench import clip_reader


def _epochs(reading_cpu: float) -> list[dict]:
    return [{"samples": 1000, "seconds": 2.0, "reading_cpu": reading_cpu, "workers_cpu": 3.0}] * 3


def test_the_row_compares_the_reading_process_at_every_count_and_the_worst_decides():
    by_workers = {1: {"ours": _epochs(0.05), "open_clip": _epochs(0.10)},
                  12: {"ours": _epochs(0.08), "open_clip": _epochs(0.06)}}
    row = clip_reader.result(by_workers=by_workers, samples=1000, per_shard=100, batch=100, note="")
    assert round(row.ratio, 2) == 0.75 and row.passed is False and "worst count: 12 workers" in row.ratio_note
    assert "ours 0.050 ms" in row.notes[0] and "open_clip 0.100 ms = **2.00x**" in row.notes[0]
    by_workers[12]["ours"] = _epochs(0.06)
    assert clip_reader.result(by_workers=by_workers, samples=1000, per_shard=100, batch=100, note="").passed is True
