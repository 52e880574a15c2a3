"""Sentences from templates with independent attributes, the text counterpart of Trifeature.

Every sentence draws five attributes independently: subject, action, place, sentiment and tense, and a surface
form (one of several templates and, for sentiment, one of several adverbs). A linear probe per attribute on a
representation then says which of them it kept, exactly as the colour / shape / texture probes do for images.

Besides the sentences the generator writes what the text pipeline evaluates with, built from held-out sentences:
- STS pairs: score = number of the five attributes the two sentences share (0..5, the STS-B scale);
- C-STS pairs: each pair twice, under a condition it agrees on ("the place": score 5) and one it differs on
  (score 1), the quadruples Hyper-CL trains on;
- NLI triples: anchor, a paraphrase (same attributes, another template and adverb) and a contradiction (the
  sentiment flipped).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contrastive.modalities.text.readers import ScoredPair, Triple

SUBJECTS = ["the cat", "the dog", "a teacher", "my neighbour", "the pilot", "a child", "the doctor", "an artist"]
# (present, past, future) of each action.
ACTIONS = [("reads a book", "read a book", "will read a book"),
           ("paints a picture", "painted a picture", "will paint a picture"),
           ("cooks dinner", "cooked dinner", "will cook dinner"),
           ("plays music", "played music", "will play music"),
           ("writes a letter", "wrote a letter", "will write a letter"),
           ("fixes the bike", "fixed the bike", "will fix the bike"),
           ("watches a film", "watched a film", "will watch a film"),
           ("sings a song", "sang a song", "will sing a song")]
PLACES = ["in the park", "at the beach", "in the kitchen", "on the train", "at school", "in the garden",
          "at the office", "in the library"]
SENTIMENTS = {"positive": ["happily", "cheerfully", "joyfully"], "negative": ["sadly", "grumpily", "gloomily"]}
TENSES = ["present", "past", "future"]
TEMPLATES = ["{subject} {action} {place} {adverb} .",
             "{place} , {subject} {adverb} {action} .",
             "{adverb} , {subject} {action} {place} ."]

ATTRIBUTES: dict[str, list[str]] = {
    "subject": SUBJECTS,
    "action": [a[0].split()[0] for a in ACTIONS],
    "place": PLACES,
    "sentiment": list(SENTIMENTS),
    "tense": TENSES,
}
#: The C-STS condition text of each attribute.
CONDITIONS = {"subject": "the subject", "action": "the action", "place": "the place", "sentiment": "the mood",
              "tense": "the time"}


@dataclass(frozen=True)
class Generated:
    """sentences (N,); labels: attribute -> int64 (N,) class index; templates / adverbs: (N,) surface choices."""
    sentences: list[str]
    labels: dict[str, np.ndarray]
    templates: np.ndarray
    adverbs: np.ndarray


def render(*, subject: int, action: int, place: int, sentiment: int, tense: int, template: int, adverb: int) -> str:
    """The sentence of one attribute assignment and surface form (lower case, tokens separated by spaces)."""
    mood = list(SENTIMENTS)[sentiment]
    text = TEMPLATES[template].format(subject=SUBJECTS[subject], action=ACTIONS[action][tense], place=PLACES[place],
                                      adverb=SENTIMENTS[mood][adverb])
    return " ".join(text.split())


def generate(*, num: int, seed: int) -> Generated:
    """``num`` sentences with every attribute and surface choice drawn independently and uniformly."""
    rng = np.random.default_rng(seed)
    labels = {name: rng.integers(0, len(values), size=num).astype(np.int64) for name, values in ATTRIBUTES.items()}
    templates = rng.integers(0, len(TEMPLATES), size=num)
    adverbs = rng.integers(0, 3, size=num)
    sentences = [render(template=int(templates[i]), adverb=int(adverbs[i]),
                        **{name: int(labels[name][i]) for name in ATTRIBUTES}) for i in range(num)]
    return Generated(sentences=sentences, labels=labels, templates=templates, adverbs=adverbs)


def _attrs(g: Generated, i: int) -> dict[str, int]:
    return {name: int(g.labels[name][i]) for name in ATTRIBUTES}


def sts_pairs(g: Generated, *, rows: np.ndarray, num_pairs: int, seed: int) -> list[ScoredPair]:
    """Random pairs of ``rows``; gold score = number of shared attributes (0..5)."""
    rng = np.random.default_rng(seed)
    a, b = rng.choice(rows, size=num_pairs), rng.choice(rows, size=num_pairs)
    return [ScoredPair(g.sentences[i], g.sentences[j],
                       float(sum(int(g.labels[n][i] == g.labels[n][j]) for n in ATTRIBUTES)))
            for i, j in zip(a, b) if i != j]


def csts_pairs(g: Generated, *, rows: np.ndarray, num_pairs: int, seed: int) -> list[ScoredPair]:
    """Pairs that share some attributes and differ in others, each written twice: under a shared attribute's
    condition (score 5) and under a differing one's (score 1), in that order."""
    rng = np.random.default_rng(seed)
    pairs: list[ScoredPair] = []
    while len(pairs) < 2 * num_pairs:
        i, j = rng.choice(rows, size=2, replace=False)
        same = [n for n in ATTRIBUTES if g.labels[n][i] == g.labels[n][j]]
        differ = [n for n in ATTRIBUTES if g.labels[n][i] != g.labels[n][j]]
        if not same or not differ:
            continue
        high, low = same[rng.integers(len(same))], differ[rng.integers(len(differ))]
        pairs.append(ScoredPair(g.sentences[i], g.sentences[j], 5.0, condition=CONDITIONS[high]))
        pairs.append(ScoredPair(g.sentences[i], g.sentences[j], 1.0, condition=CONDITIONS[low]))
    return pairs


def nli_triples(g: Generated, *, rows: np.ndarray, seed: int) -> list[Triple]:
    """For every row: a paraphrase (same attributes, another template and adverb) and a contradiction (the same
    surface form with the sentiment flipped)."""
    rng = np.random.default_rng(seed)
    triples = []
    for i in rows:
        attrs = _attrs(g, int(i))
        template = (int(g.templates[i]) + 1 + int(rng.integers(len(TEMPLATES) - 1))) % len(TEMPLATES)
        adverb = (int(g.adverbs[i]) + 1 + int(rng.integers(2))) % 3
        positive = render(template=template, adverb=adverb, **attrs)
        flipped = {**attrs, "sentiment": 1 - attrs["sentiment"]}
        negative = render(template=int(g.templates[i]), adverb=int(g.adverbs[i]), **flipped)
        triples.append(Triple(g.sentences[int(i)], positive, negative))
    return triples
