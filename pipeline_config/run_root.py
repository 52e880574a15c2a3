"""Where a pipeline's relative paths point: the directory it was started in, its *run root* (in the default layout
``runs/``, ``data/``, ``mlflow.db`` and ``.prefect/`` side by side there).

A saved config (``<output_dir>/pipelines/<id>/config.yaml``) keeps the paths as they were given (``output_dir:
runs``, ``data.cache_dir: data``, the default ``sqlite:///mlflow.db``): they are part of what a person reads, and
``data.cache_dir`` is part of the content keys. Beside it, ``started_in.json`` records the run root relative to the
output_dir (``..`` in the default layout), never as an absolute path, so ``mclpipe resume`` finds it from any working
directory and after the whole directory was moved or copied.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from contrastive.engine.files import write_json

STARTED_IN = "started_in.json"


def record_started_in(pipeline_dir: Path, *, output_dir: Path) -> None:
    """Keep this process's working directory, relative to ``output_dir``, beside the pipeline's saved config."""
    write_json(Path(pipeline_dir) / STARTED_IN,
               {"run_root": os.path.relpath(Path.cwd(), Path(output_dir).resolve())})


def run_root_of_saved(config_path: Path, *, output_dir: Path, saved_output_dir: Path) -> Path:
    """The run root of the saved config ``config_path`` found under ``output_dir`` (absolute): from
    ``started_in.json``; for a config saved before it existed, the directory that holds a relative
    ``saved_output_dir`` as ``output_dir`` does, else the output_dir's parent (the default layout)."""
    record = Path(config_path).parent / STARTED_IN
    if record.exists():
        root = Path(os.path.normpath(output_dir / json.loads(record.read_text())["run_root"]))
        if root.is_dir():
            return root
    parts = Path(saved_output_dir).parts
    if not Path(saved_output_dir).is_absolute() and ".." not in parts and output_dir.parts[-len(parts):] == parts:
        return Path(*output_dir.parts[:-len(parts)])
    return output_dir.parent
