"""A prepared text dataset on disk: the sentences, their stable ids, split and attribute labels (the same index
every other dataset has, so MCL's clustering and pseudo-label steps read it unchanged), the word vocabulary of
the training sentences, and the evaluation files (STS pairs, C-STS pairs, NLI triples) in the readers' formats.

    <dir>/sentences.json   ["a sentence", ...]                   (N,)
    <dir>/index.npz        ids, split, label_<attribute>          (N,)
    <dir>/vocab.json       word vocabulary of the training split
    <dir>/sts.tsv  csts.tsv  nli.tsv                              (those that exist)
    <dir>/manifest.json    written last: kind, storage "text", attributes, files, params, digest
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from contrastive.data.dataset import (INDEX_FILE, MANIFEST_FILE, SampleIndex, _build_index, _write_json_atomic,
                                      atomic_dataset_dir, read_manifest, read_storage_index,
                                      save_index)
from contrastive.errors import DataError
from contrastive.modalities.text import generator as gen
from contrastive.modalities.text.readers import (Triple, read_csts_pairs, read_sentences, read_sts_pairs, read_triples,
                                      write_pairs, write_triples)
from contrastive.modalities.text.tokenizer import WordTokenizer

STORAGE = "text"
SENTENCES_FILE = "sentences.json"
VOCAB_FILE = "vocab.json"
EVAL_FILES = {"sts": "sts.tsv", "csts": "csts.tsv", "nli": "nli.tsv"}


def is_text_dataset(directory: Path | str) -> bool:
    manifest = read_manifest(Path(directory))
    return manifest is not None and manifest.get("storage") == STORAGE


class TextDataset(SampleIndex):
    """sentences (N,) plus the SampleIndex fields (ids, split, labels, attributes, digest); ``file(name)`` the
    path of an evaluation file (sts, csts, nli) or None."""

    def __init__(self, *, path: Path, index, manifest, sentences: list[str]):
        super().__init__(path=path, index=index, manifest=manifest)
        self.sentences = np.asarray(sentences, dtype=object)

    @classmethod
    def load(cls, path: Path | str) -> "TextDataset":
        path = Path(path)
        manifest, index = read_storage_index(path, storage=STORAGE, what="text dataset")
        try:
            sentences = json.loads((path / SENTENCES_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"text dataset {path} is damaged ({exc}): delete it and rerun the pipeline") from None
        if len(sentences) != len(index["ids"]):
            raise DataError(f"text dataset {path}: {len(sentences)} sentences but {len(index['ids'])} ids: delete it "
                            "and rerun the pipeline")
        return cls(path=path, index=index, manifest=manifest, sentences=sentences)

    def compute_digest(self) -> str:
        return _digest(self.sentences.tolist(), self.index_arrays())

    def file(self, name: str) -> Path | None:
        relative = self.manifest.get("files", {}).get(name)
        return self.path / relative if relative else None

    def tokenizer(self) -> WordTokenizer:
        return WordTokenizer.load(self.path / VOCAB_FILE)


def load_text_dataset(path: Path | str) -> TextDataset:
    return TextDataset.load(path)


def _digest(sentences: list[str], index: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps(sentences).encode())
    for name in sorted(index):
        h.update(name.encode())
        h.update(np.ascontiguousarray(index[name]).tobytes())
    return h.hexdigest()


def write_text_dataset(directory: Path, *, kind: str, sentences: list[str], ids, split, labels: dict,
                       attributes: dict[str, list[str]], params: Mapping[str, Any], vocab_min_count: int = 1,
                       eval_files: dict[str, Path] | None = None) -> dict:
    """Write the files of the module docstring into ``directory`` (the manifest last)."""
    directory = Path(directory)
    index = _build_index(ids=ids, split=split, labels=labels, attributes=attributes, num_samples=len(sentences))
    (directory / SENTENCES_FILE).write_text(json.dumps(list(sentences)))
    save_index(directory / INDEX_FILE, index)
    train = [s for s, part in zip(sentences, index["split"]) if part == "train"]
    WordTokenizer.build(train, min_count=vocab_min_count).save(directory / VOCAB_FILE)
    files = {}
    for name, source in (eval_files or {}).items():
        if Path(source).parent != directory:
            shutil.copyfile(source, directory / EVAL_FILES[name])
        files[name] = EVAL_FILES[name]
    manifest = {"kind": kind, "storage": STORAGE, "num_samples": len(sentences),
                "num_train": int((index["split"] == "train").sum()), "num_test": int((index["split"] == "test").sum()),
                "attributes": {a: list(v) for a, v in attributes.items()}, "files": files,
                "params": json.loads(json.dumps(dict(params), default=str)), "digest": _digest(list(sentences), index)}
    _write_json_atomic(directory / MANIFEST_FILE, manifest)
    return manifest


def _prepared(directory: Path, *, kind: str, params: Mapping[str, Any]) -> bool:
    manifest = read_manifest(directory)
    return (manifest is not None and manifest.get("kind") == kind and manifest.get("storage") == STORAGE
            and manifest.get("params") == json.loads(json.dumps(dict(params), default=str)))


@dataclass(frozen=True)
class GeneratorParams:
    """The template generator's sizes and seed (contrastive.modalities.text.generator)."""
    num_train: int = 2000
    num_test: int = 500
    num_sts_pairs: int = 400
    num_csts_pairs: int = 200
    vocab_min_count: int = 1
    seed: int = 0


def prepare_generated_text(*, root: Path | str, params: GeneratorParams) -> Path:
    """Generate (once; later calls find it) the template sentences, their labels, vocabulary and evaluation files.
    Train and test sentences are drawn from the same distribution; STS and C-STS pairs use test sentences, NLI
    triples one per training sentence (anchors in dataset order, for supervised SimCSE)."""
    values = dict(params.__dict__)
    target = Path(root).resolve() / f"text-generator-{hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]}"
    if _prepared(target, kind="text_generator", params=values):
        return target
    total = params.num_train + params.num_test
    g = gen.generate(num=total, seed=params.seed)
    split = np.array(["train"] * params.num_train + ["test"] * params.num_test)
    test_rows = np.arange(params.num_train, total)
    with atomic_dataset_dir(target, keep_existing=lambda t: _prepared(t, kind="text_generator", params=values)) as tmp:
        files = {"sts": write_pairs(tmp / EVAL_FILES["sts"], gen.sts_pairs(
                     g, rows=test_rows, num_pairs=params.num_sts_pairs, seed=params.seed + 1)),
                 "csts": write_pairs(tmp / EVAL_FILES["csts"], gen.csts_pairs(
                     g, rows=test_rows, num_pairs=params.num_csts_pairs, seed=params.seed + 2)),
                 "nli": write_triples(tmp / EVAL_FILES["nli"], gen.nli_triples(
                     g, rows=np.arange(params.num_train), seed=params.seed + 3))}
        write_text_dataset(tmp, kind="text_generator", sentences=g.sentences,
                           ids=[f"g{i:07d}" for i in range(total)], split=split, labels=g.labels,
                           attributes=gen.ATTRIBUTES, params=values, vocab_min_count=params.vocab_min_count,
                           eval_files=files)
    return target


def prepare_text_files(*, root: Path | str, sentences_path: Path | None, sts_path: Path | None = None,
                       csts_path: Path | None = None, nli_path: Path | None = None, test_fraction: float = 0.0,
                       vocab_min_count: int = 1, seed: int = 0) -> Path:
    """A dataset from the user's files: the sentences of ``sentences_path`` (or, without it, the anchors of the NLI
    triples), no attribute labels; a seeded ``test_fraction`` of them held out; the evaluation files checked with
    their readers (errors name file and line) and copied in. Keyed by the files' sizes and modification times."""
    sources = {"sentences": sentences_path, "sts": sts_path, "csts": csts_path, "nli": nli_path}
    stamp = {k: [str(Path(p).resolve()), Path(p).stat().st_size, Path(p).stat().st_mtime_ns]
             if p is not None and Path(p).is_file() else (str(p) if p is not None else None)
             for k, p in sources.items()}
    values = {"files": stamp, "test_fraction": test_fraction, "vocab_min_count": vocab_min_count, "seed": seed}
    target = Path(root).resolve() / f"text-files-{hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]}"
    if _prepared(target, kind="text_files", params=values):
        return target
    triples: list[Triple] | None = read_triples(nli_path) if nli_path is not None else None
    if sentences_path is not None:
        sentences = read_sentences(sentences_path)
    elif triples is not None:
        sentences = [t.anchor for t in triples]
    else:
        raise DataError("data.kind files needs data.files.sentences (one sentence a line) or data.files.nli")
    if sts_path is not None:
        read_sts_pairs(sts_path)
    if csts_path is not None:
        read_csts_pairs(csts_path)
    rng = np.random.default_rng(seed)
    split = np.where(rng.random(len(sentences)) < test_fraction, "test", "train")
    files = {name: path for name, path in (("sts", sts_path), ("csts", csts_path), ("nli", nli_path)) if path}
    with atomic_dataset_dir(target, keep_existing=lambda t: _prepared(t, kind="text_files", params=values)) as tmp:
        write_text_dataset(tmp, kind="text_files", sentences=sentences,
                           ids=[f"s{i:08d}" for i in range(len(sentences))], split=split, labels={}, attributes={},
                           params=values, vocab_min_count=vocab_min_count, eval_files=files)
    return target


def triples_for(dataset: TextDataset, rows: np.ndarray) -> tuple[list[str], list[str]]:
    """(positives, hard negatives) of the sentences at ``rows``, from the dataset's NLI file, matched by anchor
    text. DataError naming the first sentence without a triple."""
    path = dataset.file("nli")
    if path is None:
        raise DataError(f"supervised SimCSE needs NLI triples but dataset {dataset.path} has none: set "
                        "data.files.nli (anchor, positive, negative columns) or use method.name simcse_unsup")
    by_anchor = {t.anchor: t for t in read_triples(path)}
    positives, negatives = [], []
    for row in rows:
        triple = by_anchor.get(dataset.sentences[row])
        if triple is None:
            raise DataError(f"sentence {dataset.sentences[row]!r} (id {dataset.ids[row]}) has no triple in {path}: "
                            "every training sentence needs one for supervised SimCSE")
        positives.append(triple.positive)
        negatives.append(triple.negative)
    return positives, negatives
