"""A local MLflow store that moved or was copied with its run directory (a bigger disk, another mount point, another
machine, an archive unpacked elsewhere): its artifact locations follow it.

MLflow keeps absolute locations in the store: the experiment's ``artifact_location``, each run's ``artifact_uri``,
each logged model's and model version's. Left as they are, a copied store reads and writes the artifacts of the
original directory, and a moved one recreates the old path. When a :class:`~tasks.tracking.Tracker` opens a local
SQLite store whose experiment's artifact location lies where the store *was* (the same place relative to the
store's directory, under another directory), every location under that old directory is rewritten to the same place
under the store's directory now, in one transaction, and one line says so. The store's directory is what counts:
the artifacts (``runs/mlartifacts``) sit at the same place relative to it before and after. An output_dir moved
without its store (the store elsewhere, the old disk unmounted) leaves an artifact location that no longer exists:
it is pointed at this run's artifact folder the same way, so nothing recreates the old place.

Which place relative to the store the experiment's artifacts have is kept as an experiment tag (relative, so it
holds on any machine); an experiment made by an earlier version without it is taken to keep its artifacts where this
run puts them. A store shared with a tracking server is the server's business: nothing here applies.
"""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

#: The experiment's artifact location relative to the directory of its store (e.g. ``runs/mlartifacts``).
ARTIFACT_ROOT_TAG = "mclpipe.artifact_root"
#: Where a store names artifact locations: {table: columns}.
LOCATION_COLUMNS = {"experiments": ("artifact_location",), "runs": ("artifact_uri",),
                    "logged_models": ("artifact_location",), "model_versions": ("source", "storage_location")}


def sqlite_database(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for any other store)."""
    if not uri.startswith("sqlite:///") or uri == "sqlite:///:memory:":
        return None
    return Path(unquote(uri.removeprefix("sqlite:///")).split("?", 1)[0])


def location_path(location: str) -> Path:
    """The local path of an artifact location (a ``file://`` URI or a plain path)."""
    parsed = urlparse(location)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(location)


def artifact_root_tag(*, database: Path, artifact_root: Path) -> str | None:
    """The tag value for an experiment whose artifacts are in ``artifact_root``: that directory relative to the
    store's (None when it is not below it: then a move cannot be told from another layout)."""
    try:
        return str(artifact_root.resolve().relative_to(database.resolve().parent))
    except ValueError:
        return None


def former_store_dir(*, location: str, tags: dict[str, str], database: Path, artifact_root: Path) -> Path | None:
    """The directory the store was in when the experiment's artifact ``location`` was set, when that is not the one
    it is in now (the store moved or was copied), else None."""
    current = location_path(location)
    if current == artifact_root.resolve():
        return None
    relative = tags.get(ARTIFACT_ROOT_TAG) or artifact_root_tag(database=database, artifact_root=artifact_root)
    if relative is None:
        return None
    parts = Path(relative).parts
    if not parts or ".." in parts or current.parts[-len(parts):] != parts:
        return None  # not the same place relative to a store: another layout, left alone
    former = Path(*current.parts[:-len(parts)])
    return former if former != database.resolve().parent else None


def relocate_store(database: Path, *, former: Path, now: Path) -> int:
    """Point every artifact location of the store at or under ``former`` at the same place under ``now``, in one
    transaction; returns how many locations changed."""
    prefixes = [(former.as_uri(), now.as_uri()), (str(former), str(now))]
    changed = 0
    with sqlite3.connect(database) as db:  # commits once, at the end, or rolls everything back
        tables = {row[0] for row in db.execute("select name from sqlite_master where type = 'table'")}
        for table, columns in LOCATION_COLUMNS.items():
            if table not in tables:
                continue
            for column in columns:
                for old, new in prefixes:
                    changed += db.execute(
                        f"update {table} set {column} = ? || substr({column}, ?) "
                        f"where {column} = ? or substr({column}, 1, ?) = ?",
                        (new, len(old) + 1, old, len(old) + 1, old + "/")).rowcount
    db.close()
    return changed


def follow_moved_store(client, experiment, *, database: Path, artifact_root: Path) -> None:
    """Rewrite the store's artifact locations when it moved (module docstring), with one line; tag an experiment
    that has no artifact-root tag yet while it is where it was made."""
    former = former_store_dir(location=experiment.artifact_location, tags=experiment.tags, database=database,
                              artifact_root=artifact_root)
    now = database.resolve().parent
    location, here = location_path(experiment.artifact_location), artifact_root.resolve()
    if former is not None:
        changed = relocate_store(database, former=former, now=now)
        log.warning("the MLflow store %s was made in %s and is now in %s (a moved or copied run directory): its %d "
                    "artifact locations now point here, nothing is read from or written to the old place",
                    database.name, former, now, changed)
    elif location != here and not location.exists():
        changed = relocate_store(database, former=location, now=here)
        log.warning("the MLflow artifact folder %s is gone (an output_dir moved without its store, an unmounted "
                    "disk): its %d artifact locations now point at %s, this run's, and nothing is written to the old "
                    "place", location, changed, here)
    if ARTIFACT_ROOT_TAG not in experiment.tags:
        tag = artifact_root_tag(database=database, artifact_root=artifact_root)
        if tag is not None and (former is not None or location_path(experiment.artifact_location)
                                == artifact_root.resolve()):
            client.set_experiment_tag(experiment.experiment_id, ARTIFACT_ROOT_TAG, tag)
