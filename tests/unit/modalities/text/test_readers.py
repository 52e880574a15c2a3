import pytest

from contrastive.errors import DataError
from contrastive.modalities.text.readers import (ScoredPair, Triple, read_csts_pairs, read_sentences, read_sts_pairs,
                                      read_triples, write_pairs, write_triples)


def test_sentences_skip_blank_lines(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("first sentence\n\n  second one  \n")
    assert read_sentences(path) == ["first sentence", "second one"]


def test_sentences_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "s.txt"
    path.write_bytes(b"good line\n\xff\xfe bad\n")
    with pytest.raises(DataError, match=r"s\.txt:2: not UTF-8"):
        read_sentences(path)
    with pytest.raises(DataError, match="does not exist"):
        read_sentences(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DataError, match="no sentences"):
        read_sentences(tmp_path / "empty.txt")


def test_sts_tsv_and_csv(tmp_path):
    tsv = tmp_path / "sts.tsv"
    tsv.write_text("genre\tsentence1\tsentence2\tscore\nnews\ta cat\ta kitten\t4.5\n")
    assert read_sts_pairs(tsv) == [ScoredPair("a cat", "a kitten", 4.5)]
    csv_path = tmp_path / "sts.csv"
    csv_path.write_text('sentence1,sentence2,score\n"a, quoted",b,1\n')
    assert read_sts_pairs(csv_path) == [ScoredPair("a, quoted", "b", 1.0)]


@pytest.mark.parametrize("body, message", [
    ("sentence1\tscore\na\t1\n", r"sts\.tsv:1: header .* lacks column\(s\) \['sentence2'\]"),
    ("sentence1\tsentence2\tscore\na\tb\t1\nc\td\tfive\n", r"sts\.tsv:3: score 'five' is not a number"),
    ("sentence1\tsentence2\tscore\na\tb\n", r"sts\.tsv:2: 2 field\(s\) but the header has 3"),
    ("sentence1\tsentence2\tscore\n\tb\t1\n", r"sts\.tsv:2: column 'sentence1' is empty"),
    ("sentence1\tsentence2\tscore\na\tb\tnan\n", r"sts\.tsv:2: score 'nan' is not finite"),
])
def test_sts_errors_name_file_and_line(tmp_path, body, message):
    path = tmp_path / "sts.tsv"
    path.write_text(body)
    with pytest.raises(DataError, match=message):
        read_sts_pairs(path)


def test_csts_needs_condition_and_round_trips(tmp_path):
    pairs = [ScoredPair("a b", "c d", 5.0, condition="the place"), ScoredPair("a b", "c d", 1.0, condition="the mood")]
    path = write_pairs(tmp_path / "c.tsv", pairs)
    assert read_csts_pairs(path) == pairs
    sts_only = write_pairs(tmp_path / "s.tsv", [ScoredPair("x", "y", 2.0)])
    with pytest.raises(DataError, match="lacks column.*condition"):
        read_csts_pairs(sts_only)


def test_triples_round_trip_and_errors(tmp_path):
    triples = [Triple("a", "b", "c"), Triple("d", "e", "f")]
    assert read_triples(write_triples(tmp_path / "nli.csv", triples)) == triples
    bad = tmp_path / "bad.tsv"
    bad.write_text("anchor\tpositive\tnegative\na\tb\t\n")
    with pytest.raises(DataError, match=r"bad\.tsv:2: column 'negative' is empty"):
        read_triples(bad)
