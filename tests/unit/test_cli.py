"""What ``mclpipe`` prints that is not a pipeline's: its version and the resolved config, as written."""
import tomllib
from pathlib import Path

from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]


def test_version_is_the_one_in_pyproject():
    """``mclpipe --version`` reads the installed distribution's metadata, whose one source is pyproject.toml."""
    from flows.cli import app
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"mclpipe {expected}"


def test_show_config_prints_slurm_times_as_written_not_as_emoji():
    """rich replaces ``:name:`` by an emoji unless told not to: the Slurm time's description "H:M:S" came out as
    "HⓂS"; a value holding ``:m:`` or ``:ok:`` would too."""
    from flows.cli import app
    result = CliRunner().invoke(app, ["show-config", "trifeature_quick", "--set", "launcher.kind=slurm",
                                      "--set", "launcher.slurm.time_limit=1:00:00"])
    assert result.exit_code == 0, result.output
    lines = {line.split(":", 1)[0].strip(): line for line in result.output.splitlines()}
    assert "1:00:00" in lines["time_limit"] and "M, H:M:S or D-H:M:S" in lines["time_limit"], lines["time_limit"]
    assert "Ⓜ" not in result.output
