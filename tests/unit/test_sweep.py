"""The sweep's grid parsing, expansion and comparison against hand-computed values."""
import csv
import statistics

import pytest

from contrastive.errors import ConfigError
from contrastive.sweep import (SweepRun, aggregate, comparison_markdown, expand_grid, parse_grid, plot_against,
                               point_overrides, split_values, write_csv)


def test_values_split_outside_brackets():
    assert split_values("2,5,10") == ["2", "5", "10"]
    assert split_values("[4,2],[8, 2]") == ["[4,2]", "[8, 2]"]


def test_grid_parsing_and_errors():
    grid = parse_grid(["mcl.clusters=2,5", "method.temperature=0.1,0.5,1.0"])
    assert grid == {"mcl.clusters": ["2", "5"], "method.temperature": ["0.1", "0.5", "1.0"]}
    points = expand_grid(grid)
    assert len(points) == 6 and points[0] == {"mcl.clusters": "2", "method.temperature": "0.1"}
    assert points[1] == {"mcl.clusters": "2", "method.temperature": "0.5"}  # the last key varies fastest
    assert point_overrides(points[0], seed=3) == ["mcl.clusters=2", "method.temperature=0.1", "seed=3"]
    for bad, match in ((["mcl.clusters"], "KEY=V1"), (["a=1", "a=2"], "twice"), (["seed=0,1"], "--seeds"),
                       ([], "at least one"), (["a=1,,2"], "KEY=V1")):
        with pytest.raises(ConfigError, match=match):
            parse_grid(bad)


def runs():
    def result(shape, color):
        return {"stage 0": {"probe/shape": shape, "probe/color": color, "knn/shape": 0.0},
                "MCL concat": {"probe/shape": shape + 0.1, "probe/color": color}}
    return [SweepRun(point={"k": "2"}, seed=1, results=result(0.4, 1.0)),
            SweepRun(point={"k": "2"}, seed=0, results=result(0.5, 1.0)),
            SweepRun(point={"k": "5"}, seed=0, results=result(0.7, 0.9))]


def test_aggregate_mean_and_population_std_over_seeds(tmp_path):
    rows = aggregate(runs())
    first = rows[0]
    assert (first["k"], first["representation"], first["attribute"]) == ("2", "stage 0", "color")
    shape = next(r for r in rows if r["k"] == "2" and r["representation"] == "MCL concat" and r["attribute"] == "shape")
    assert shape["values"] == pytest.approx([0.6, 0.5])  # seed order
    assert shape["mean"] == pytest.approx(0.55) and shape["std"] == pytest.approx(statistics.pstdev([0.6, 0.5]))
    assert shape["n"] == 2
    assert len(rows) == 2 * 2 * 2  # points x representations x attributes (knn is not the probe metric)
    table = comparison_markdown(rows, keys=["k"])
    assert "| k | representation | color | shape |" in table
    assert "| 2 | MCL concat | 1.000 ± 0.000 | 0.550 ± 0.050 |" in table
    path = write_csv(rows, tmp_path / "c.csv", keys=["k"])
    with path.open() as handle:
        read = list(csv.DictReader(handle))
    assert len(read) == 8 and read[0]["values"] == "1.000000;1.000000"
    assert plot_against(rows, key="k", path=tmp_path / "p.png").stat().st_size > 1000


def test_a_config_files_sweep_section_and_the_command_line(tmp_path):
    from flows.sweep_flow import plan_sweep
    from pipeline_config.loader import load_config

    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmcl: {num_stages: 2}\n"
                    "sweep: {grid: {mcl.clusters: [[4, 2], 8], method.temperature: [0.1, 0.5]}, seeds: [0, 1]}\n")
    assert load_config(path, []).mcl.num_stages == 2  # `mclpipe run` ignores the sweep section
    grid, seeds = plan_sweep(config=str(path), grid=[], seeds=None)
    assert grid == {"mcl.clusters": ["[4, 2]", "8"], "method.temperature": ["0.1", "0.5"]} and seeds == [0, 1]
    assert load_config(path, ["mcl.clusters=[4, 2]"]).mcl.clusters == [4, 2]
    grid, seeds = plan_sweep(config=str(path), grid=["method.temperature=0.2", "train.epochs=1,2"], seeds=[3])
    assert grid["method.temperature"] == ["0.2"] and grid["train.epochs"] == ["1", "2"] and seeds == [3]
    with pytest.raises(ConfigError, match="nothing to sweep"):
        plan_sweep(config="trifeature_tiny", grid=[], seeds=None)
    path.write_text("sweep: {grid: [1, 2]}\n")
    with pytest.raises(ConfigError, match="sweep section must be"):
        plan_sweep(config=str(path), grid=[], seeds=None)
    assert plan_sweep(config="paper_fig6_cifar_mnist_clusters", grid=[], seeds=None)[0] == {
        "mcl.clusters": ["2", "5", "10"]}
