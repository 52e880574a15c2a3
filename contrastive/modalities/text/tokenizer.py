"""Tokenizers: a word-level vocabulary for the from-scratch encoder, and a wrapper of a local Hugging Face
tokenizer (MiniLM's WordPiece) with the same interface.

Both turn sentences into int64 ``input_ids`` (N, L) and ``attention_mask`` (N, L) (1 = token, 0 = padding), the
first token of every sentence being the classifier token that CLS pooling reads.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

from contrastive.errors import ConfigError, DataError

PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"
_WORD = re.compile(r"\w+|[^\w\s]")


def words(sentence: str) -> list[str]:
    """Lower-cased words and punctuation marks."""
    return _WORD.findall(sentence.lower())


class WordTokenizer:
    """Word-level vocabulary: [PAD] = 0, [UNK] = 1, [CLS] = 2, then the words of the training sentences by
    decreasing frequency (ties alphabetical), those seen fewer than ``min_count`` times mapped to [UNK]."""

    def __init__(self, vocab: list[str]):
        if vocab[:3] != [PAD, UNK, CLS]:
            raise DataError(f"vocabulary must start with {PAD}, {UNK}, {CLS}; got {vocab[:3]}")
        self.vocab = list(vocab)
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.cls_id = 0, 1, 2

    @classmethod
    def build(cls, sentences: list[str], *, min_count: int = 1, max_size: int | None = None) -> "WordTokenizer":
        counts = Counter(w for s in sentences for w in words(s))
        kept = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls([PAD, UNK, CLS, *kept[:max_size]])

    def __len__(self) -> int:
        return len(self.vocab)

    def save(self, path: Path | str) -> Path:
        Path(path).write_text(json.dumps({"vocab": self.vocab}))
        return Path(path)

    @classmethod
    def load(cls, path: Path | str) -> "WordTokenizer":
        path = Path(path)
        if not path.is_file():
            raise DataError(f"vocabulary {path} is missing: rerun the pipeline to prepare the text data again")
        return cls(json.loads(path.read_text())["vocab"])

    def encode(self, sentences: list[str], *, max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """int64 (N, max_length) ids and mask: [CLS] then the words, truncated, padded with [PAD]."""
        if max_length < 2:
            raise ConfigError(f"model.max_length must be >= 2 (the [CLS] token and a word), got {max_length}")
        ids = np.full((len(sentences), max_length), self.pad_id, dtype=np.int64)
        for row, sentence in enumerate(sentences):
            tokens = [self.cls_id, *(self.index.get(w, self.unk_id) for w in words(sentence))][:max_length]
            ids[row, :len(tokens)] = tokens
        return ids, (ids != self.pad_id).astype(np.int64)

    def decode_ids(self, ids) -> list[str]:
        return [self.vocab[int(i)] for i in ids]


class HFTokenizer:
    """A Hugging Face tokenizer read from a local checkpoint directory (nothing is downloaded)."""

    def __init__(self, path: Path | str):
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise ConfigError("model.encoder hf needs the optional extra: pip install 'mclpipe[text]' "
                              "(transformers)") from None
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, sentences: list[str], *, max_length: int) -> tuple[np.ndarray, np.ndarray]:
        out = self.tokenizer(list(sentences), padding="max_length", truncation=True, max_length=max_length,
                             return_tensors="np")
        return out["input_ids"].astype(np.int64), out["attention_mask"].astype(np.int64)

    def decode_ids(self, ids) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens([int(i) for i in ids])
