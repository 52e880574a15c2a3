"""tests/components.py: a component a test needs is skipped for on a developer's machine and fails under CI, where
.ci/run installs every one of them before the tests."""
import pytest

from tests import components


@pytest.mark.parametrize("ci, outcome", [(None, pytest.skip.Exception), ("false", pytest.skip.Exception),
                                         ("true", pytest.fail.Exception), ("1", pytest.fail.Exception)])
def test_a_missing_module_skips_on_a_developer_machine_and_fails_under_ci(monkeypatch, ci, outcome):
    monkeypatch.delenv("CI", raising=False)
    if ci is not None:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="'no_such_module_of_mclpipe.sub'.*bash .ci/setup-text.sh"):
        components.require_modules("no_such_module_of_mclpipe.sub", fix=components.TEXT_EXTRA)


def test_a_present_module_is_imported_and_returned(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert components.require_modules("json", "os.path", fix="-").join("a", "b") == "a/b"
    assert components.has_modules("json", "os") and not components.has_modules("json", "no_such_module_of_mclpipe")
