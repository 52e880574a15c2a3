"""`make bench` rewrites BENCHMARKS.md from its measurements and keeps what it cannot measure again."""
from bench.run_all import HISTORY_BEGIN, HISTORY_END, keep_gpu_check_section


def test_make_bench_keeps_the_history_section(tmp_path):
    """The hand-written history of the GPU runs (moved there from docs/gpu.md) outlives a `make bench`."""
    history = f"{HISTORY_BEGIN}\n## History of `make gpu-check` runs\n\n| row | first run |\n{HISTORY_END}\n"
    previous = "# Benchmarks\n\nold CPU rows\n\n" + history
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\nnew CPU rows\n")  # what make bench just wrote
    keep_gpu_check_section(previous, path)
    text = path.read_text()
    assert "new CPU rows" in text and "old CPU rows" not in text
    assert text.endswith(history)
    keep_gpu_check_section(text, path)  # a second `make bench` keeps one copy
    assert path.read_text().count(HISTORY_BEGIN) == 1
