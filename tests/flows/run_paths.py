"""Which files of a run directory name an absolute path (issue 47: a run directory that moves keeps no path of the
machine that wrote it). Looks inside what a plain grep cannot read: zip archives (``.npz``, torch's ``.pt``) and
the result payloads of Prefect's result store."""
from __future__ import annotations

import base64
import binascii
import json
import zipfile
from pathlib import Path

#: Files that are history and may name the paths of the machine that wrote them: the run's log files.
HISTORY = ("logs/*.log",)
PREFECT_RESULTS = "prefect-results"


#: The config as it was given (kept with the pipeline and in its MLflow run): an output_dir given absolute stays so.
CONFIGS = ("config.yaml", "config.json")


def files_naming(run_dir: Path, path: Path | str, *, output_dir_given_absolute: bool = False) -> dict[str, list[str]]:
    """{file relative to ``run_dir``: where in it ``path`` is named} for every file under ``run_dir`` that names
    ``path``, but for the history files (``HISTORY``) and the ``storage_key`` of Prefect's result metadata (Prefect
    records there where it wrote the file; it reads its results by key from where the store is now). With
    ``output_dir_given_absolute`` the saved configs' ``output_dir`` may name it too (the config as it was given)."""
    import yaml
    needle = str(path).encode()
    found = {}
    for file in sorted(p for p in Path(run_dir).rglob("*") if p.is_file()):
        name = file.relative_to(run_dir)
        if any(name.match(pattern) for pattern in HISTORY):
            continue
        data = file.read_bytes()
        if output_dir_given_absolute and file.name in CONFIGS:
            config = yaml.safe_load(data)  # JSON is YAML
            config.pop("output_dir", None)
            data = json.dumps(config).encode()
        if file.parent.name == PREFECT_RESULTS:
            where = _in_prefect_result(data, needle)
        else:
            where = ["the file"] if needle in data else []
            if zipfile.is_zipfile(file):
                with zipfile.ZipFile(file) as archive:
                    where += [f"member {member}" for member in archive.namelist() if needle in archive.read(member)]
        if where:
            found[str(name)] = where
    return found


def _in_prefect_result(data: bytes, needle: bytes) -> list[str]:
    """Where a file of Prefect's result store names ``needle``, its metadata's ``storage_key`` left out: the rest of
    the metadata, and the result payload (decoded where it is base64, as a pickle is)."""
    record = json.loads(data)
    metadata = {k: v for k, v in record.get("metadata", {}).items() if k != "storage_key"}
    where = ["the metadata"] if needle in json.dumps(metadata).encode() else []
    payload = str(record.get("result", "")).encode()
    try:
        decoded = base64.b64decode(b"".join(payload.split()), validate=True)  # a pickle, base64 in lines
    except binascii.Error:
        decoded = b""
    if needle in payload or needle in decoded:
        where.append("the result")
    return where
