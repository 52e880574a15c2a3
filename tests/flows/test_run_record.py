"""What a run records about itself (flows.run_record): summary.json and the reproduce JSON carry the wall time, the
steps computed and reused, the machine and when it finished, which the docs render their run times from."""
import json

from typer.testing import CliRunner

from flows import cli, run_record


def test_record_run_adds_wall_time_machine_and_when_to_summary_json(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"results": {}, "steps": {"computed": 7, "reused": 2}}))
    summary = {"results": {}, "steps": {"computed": 7, "reused": 2}, "dir": str(tmp_path), "tracking_hint": "x"}
    recorded = run_record.record_run(summary, wall_seconds=183.26, load_at_start=1.5)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["wall_seconds"] == 183.3 and written["steps"] == {"computed": 7, "reused": 2}
    assert written["machine"]["cores"] >= 1 and written["machine"]["cpu"]
    assert written["machine"]["load_average"][0] == 1.5 and len(written["finished_at"]) == len("2026-11-28T19:40Z")
    assert "dir" not in written and recorded["dir"] == str(tmp_path)


def test_reproduce_writes_each_seeds_time_the_summed_steps_and_the_machine(tmp_path, monkeypatch):
    def one_seed(cfg, rerun_from=None, *, force=False):
        reused = 9 if cfg.seed == 0 else 0  # seed 0 finished earlier: a reproduce run that reuses it
        return {"results": {"stage 0": {"probe/shape": 0.25 + cfg.seed / 100}}, "pipeline_id": f"p{cfg.seed}",
                "wall_seconds": 60.0 + cfg.seed, "steps": {"computed": 9 - reused, "reused": reused}}
    monkeypatch.setattr(cli, "run_pipeline", one_seed)
    result = CliRunner().invoke(cli.app, ["reproduce", "trifeature_quick", "--seeds", "0,1",
                                          "--set", f"output_dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "reproduce" / "trifeature_quick.json").read_text())
    assert written["steps"] == {"computed": 9, "reused": 9}
    assert [(r["pipeline_id"], r["wall_seconds"]) for r in written["seed_runs"]] == [("p0", 60.0), ("p1", 61.0)]
    assert written["machine"]["cores"] >= 1 and written["finished_at"].endswith("Z")
    assert written["per_seed"][1]["stage 0"]["probe/shape"] == 0.26
