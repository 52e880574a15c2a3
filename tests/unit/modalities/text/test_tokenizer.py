import numpy as np
import pytest

from contrastive.errors import ConfigError, DataError
from contrastive.modalities.text.tokenizer import WordTokenizer, words


def test_vocabulary_order_and_encoding(tmp_path):
    tok = WordTokenizer.build(["the cat sat .", "the dog sat", "a bird"], min_count=2)
    assert tok.vocab == ["[PAD]", "[UNK]", "[CLS]", "sat", "the"]
    ids, mask = tok.encode(["The cat sat!", "the"], max_length=4)
    np.testing.assert_array_equal(ids, [[2, 4, 1, 3], [2, 4, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1], [1, 1, 0, 0]])
    assert WordTokenizer.load(tok.save(tmp_path / "v.json")).vocab == tok.vocab
    assert words("Hello, World!") == ["hello", ",", "world", "!"]


def test_errors():
    with pytest.raises(ConfigError, match="max_length"):
        WordTokenizer.build(["a"]).encode(["a"], max_length=1)
    with pytest.raises(DataError, match="must start with"):
        WordTokenizer(["a", "b", "c"])
