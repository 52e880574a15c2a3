import numpy as np

from contrastive.modalities.text import generator as gen
from contrastive.modalities.text.tokenizer import words


def _parse(sentence: str) -> dict[str, int]:
    """Recover the attributes of a generated sentence from its words (a hand-written inverse of render)."""
    found = {"subject": [i for i, s in enumerate(gen.SUBJECTS) if f" {s} " in f" {sentence} "],
             "place": [i for i, p in enumerate(gen.PLACES) if p in sentence],
             "sentiment": [i for i, m in enumerate(gen.SENTIMENTS) if any(a in sentence.split()
                                                                          for a in gen.SENTIMENTS[m])]}
    actions = [(a, t) for a, forms in enumerate(gen.ACTIONS) for t, form in enumerate(forms)
               if f" {form} " in f" {sentence} "]
    # "will read a book" also contains the past form "read a book": the longest match is the tense used.
    action, tense = max(actions, key=lambda at: len(gen.ACTIONS[at[0]][at[1]]))
    return {"subject": found["subject"][0], "place": found["place"][0], "sentiment": found["sentiment"][0],
            "action": action, "tense": tense}


def test_labels_match_the_rendered_sentences():
    g = gen.generate(num=300, seed=3)
    for i, sentence in enumerate(g.sentences):
        assert _parse(sentence) == {n: int(g.labels[n][i]) for n in gen.ATTRIBUTES}, sentence


def test_attributes_are_drawn_independently():
    g = gen.generate(num=6000, seed=0)
    for name, values in gen.ATTRIBUTES.items():
        assert set(np.unique(g.labels[name])) == set(range(len(values)))
    # Independence: the joint frequency of two attributes is close to the product of the marginals.
    joint = np.zeros((8, 3))
    np.add.at(joint, (g.labels["place"], g.labels["tense"]), 1)
    joint /= joint.sum()
    expected = joint.sum(1, keepdims=True) * joint.sum(0, keepdims=True)
    assert np.abs(joint - expected).max() < 0.01


def test_sts_score_counts_shared_attributes():
    g = gen.generate(num=200, seed=1)
    index = {s: i for i, s in enumerate(g.sentences)}
    for pair in gen.sts_pairs(g, rows=np.arange(200), num_pairs=50, seed=0):
        i, j = index[pair.sentence1], index[pair.sentence2]
        assert pair.score == sum(g.labels[n][i] == g.labels[n][j] for n in gen.ATTRIBUTES)


def test_csts_pairs_come_high_then_low_with_true_conditions():
    g = gen.generate(num=200, seed=2)
    index = {s: i for i, s in enumerate(g.sentences)}
    by_condition = {c: n for n, c in gen.CONDITIONS.items()}
    pairs = gen.csts_pairs(g, rows=np.arange(200), num_pairs=20, seed=0)
    assert len(pairs) == 40
    for high, low in zip(pairs[0::2], pairs[1::2]):
        assert (high.sentence1, high.sentence2) == (low.sentence1, low.sentence2)
        i, j = index[high.sentence1], index[high.sentence2]
        assert (high.score, low.score) == (5.0, 1.0)
        assert g.labels[by_condition[high.condition]][i] == g.labels[by_condition[high.condition]][j]
        assert g.labels[by_condition[low.condition]][i] != g.labels[by_condition[low.condition]][j]


def test_nli_positive_paraphrases_and_negative_flips_sentiment():
    g = gen.generate(num=100, seed=4)
    for i, t in enumerate(gen.nli_triples(g, rows=np.arange(100), seed=0)):
        anchor, positive, negative = _parse(t.anchor), _parse(t.positive), _parse(t.negative)
        assert positive == anchor and t.positive != t.anchor
        assert negative == {**anchor, "sentiment": 1 - anchor["sentiment"]}
        assert len(words(t.negative)) == len(words(t.anchor))
