import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[2] / "contrastive"


def test_library_imports_neither_prefect_nor_mlflow():
    offenders = []
    for path in LIBRARY.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in {"prefect", "mlflow"}]
    assert not offenders, offenders
    assert len(list(LIBRARY.rglob("*.py"))) > 10
