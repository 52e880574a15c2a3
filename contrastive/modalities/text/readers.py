"""Readers of the text formats mclpipe trains and evaluates on; every malformed row is reported with its file and
line number and what a good row looks like.

- sentences: a UTF-8 text file, one sentence a line (the format unsupervised SimCSE trains on); blank lines are
  skipped.
- STS pairs (STS-B style): TSV or CSV (by extension; ``.tsv``/``.txt`` tab, ``.csv`` comma) with a header naming
  ``sentence1``, ``sentence2`` and ``score`` (extra columns are ignored).
- C-STS pairs: the same with a ``condition`` column: one sentence pair judged under a condition ("the colour").
- NLI triples (supervised SimCSE): ``anchor``, ``positive`` (entailment), ``negative`` (contradiction).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from contrastive.errors import DataError


@dataclass(frozen=True)
class ScoredPair:
    """Two sentences, a gold similarity score and, for C-STS, the condition they were judged under."""
    sentence1: str
    sentence2: str
    score: float
    condition: str | None = None


@dataclass(frozen=True)
class Triple:
    """Supervised SimCSE's (anchor, entailment positive, contradiction hard negative)."""
    anchor: str
    positive: str
    negative: str


def _open(path: Path | str, *, what: str):
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} file {str(path)!r} does not exist: fix the path in the config")
    return path


def read_sentences(path: Path | str) -> list[str]:
    """One sentence a line; blank lines skipped. DataError for a missing, empty or non-UTF-8 file."""
    path = _open(path, what="sentences")
    sentences = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise DataError(f"{path}:{number}: not UTF-8 text: re-encode the file as UTF-8") from None
            if line:
                sentences.append(line)
    if not sentences:
        raise DataError(f"{path}: no sentences (one per line expected)")
    return sentences


def _delimiter(path: Path) -> str:
    return "," if path.suffix.lower() == ".csv" else "\t"


def _rows(path: Path, *, required: tuple[str, ...], what: str):
    """(line number, row dict) of a delimited file whose header names every column in ``required``."""
    delimiter = _delimiter(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
        try:
            header = [h.strip().lower() for h in next(reader)]
        except StopIteration:
            raise DataError(f"{path}: empty {what} file (needs a header row: {', '.join(required)})") from None
        except UnicodeDecodeError:
            raise DataError(f"{path}:1: not UTF-8 text: re-encode the file as UTF-8") from None
        missing = [c for c in required if c not in header]
        if missing:
            sep = "tab" if delimiter == "\t" else "comma"
            raise DataError(f"{path}:1: header {header} lacks column(s) {missing}: a {what} file is {sep}-separated "
                            f"with a header naming {', '.join(required)}")
        positions = {c: header.index(c) for c in required}
        try:
            for row in reader:
                number = reader.line_num
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) < len(header):
                    raise DataError(f"{path}:{number}: {len(row)} field(s) but the header has {len(header)} "
                                    f"({', '.join(header)}); check the {'tabs' if delimiter == chr(9) else 'commas'}"
                                    f" and quoting of this line")
                yield number, {c: row[i].strip() for c, i in positions.items()}
        except UnicodeDecodeError:
            raise DataError(f"{path}:{reader.line_num + 1}: not UTF-8 text: re-encode the file as UTF-8") from None


def _score(path: Path, number: int, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{path}:{number}: score {text!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"{path}:{number}: score {text!r} is not finite")
    return value


def _nonempty(path: Path, number: int, row: dict, columns: tuple[str, ...]) -> None:
    for column in columns:
        if not row[column]:
            raise DataError(f"{path}:{number}: column {column!r} is empty")


def _read_table(path: Path | str, *, what: str, columns: tuple[str, ...], build) -> list:
    """``build(path, line number, row)`` for every row of a ``what`` file (e.g. "STS pairs") whose header names
    ``columns``; every column but ``score`` must be non-empty. DataError when no row is below the header."""
    path = _open(path, what=what)
    records = []
    for number, row in _rows(path, required=columns, what=what):
        _nonempty(path, number, row, tuple(c for c in columns if c != "score"))
        records.append(build(path, number, row))
    if not records:
        raise DataError(f"{path}: no {what.split()[-1]} below the header")
    return records


def _scored_pair(path: Path, number: int, row: dict) -> ScoredPair:
    """A row of an STS file, or of a C-STS file (whose rows alone carry ``condition``: _rows keeps only the
    required columns)."""
    return ScoredPair(row["sentence1"], row["sentence2"], _score(path, number, row["score"]),
                      condition=row.get("condition"))


def read_sts_pairs(path: Path | str) -> list[ScoredPair]:
    """STS-B style pairs: columns sentence1, sentence2, score."""
    return _read_table(path, what="STS pairs", columns=("sentence1", "sentence2", "score"), build=_scored_pair)


def read_csts_pairs(path: Path | str) -> list[ScoredPair]:
    """C-STS style pairs: columns sentence1, sentence2, condition, score."""
    return _read_table(path, what="C-STS pairs", columns=("sentence1", "sentence2", "condition", "score"),
                       build=_scored_pair)


def read_triples(path: Path | str) -> list[Triple]:
    """NLI triples for supervised SimCSE: columns anchor, positive, negative."""
    return _read_table(path, what="NLI triples", columns=("anchor", "positive", "negative"),
                       build=lambda path, number, row: Triple(row["anchor"], row["positive"], row["negative"]))


def write_pairs(path: Path | str, pairs: list[ScoredPair]) -> Path:
    """Write pairs in the format ``read_sts_pairs`` / ``read_csts_pairs`` read (C-STS when pairs have conditions)."""
    path = Path(path)
    with_condition = any(p.condition is not None for p in pairs)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=_delimiter(path))
        writer.writerow(["sentence1", "sentence2", *(["condition"] if with_condition else []), "score"])
        for p in pairs:
            writer.writerow([p.sentence1, p.sentence2, *([p.condition] if with_condition else []), p.score])
    return path


def write_triples(path: Path | str, triples: list[Triple]) -> Path:
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter=_delimiter(path))
        writer.writerow(["anchor", "positive", "negative"])
        for t in triples:
            writer.writerow([t.anchor, t.positive, t.negative])
    return path
