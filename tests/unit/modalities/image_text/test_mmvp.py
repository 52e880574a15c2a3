"""MMVP-VLM pair scoring against hand-computed cases, both directory formats, retrieval recall, the soup."""
import csv

import numpy as np
import pytest
import torch
from PIL import Image

from contrastive.modalities.image_text.evaluate import average_state_dicts, concat_stage_features, retrieval_recall
from contrastive.modalities.image_text.mmvp import (CATEGORIES, mmvp_scores, pair_images, pair_similarities, pair_statements,
                                   read_mmvp, write_tiny_mmvp)
from contrastive.errors import DataError


def test_a_pair_counts_only_if_both_statements_pick_their_image():
    # [p, i, j] = similarity of statement i and image j
    sims = np.array([
        [[0.9, 0.1], [0.2, 0.8]],   # both right
        [[0.9, 0.1], [0.8, 0.2]],   # statement b picks image a: wrong
        [[0.4, 0.6], [0.2, 0.8]],   # statement a picks image b: wrong
        [[0.5, 0.5], [0.1, 0.9]],   # tie on a: wrong
    ])
    scores = mmvp_scores(similarities=sims, categories=["Texts", "Texts", "Color and Appearance", "Texts"])
    assert scores["mmvp/texts"] == pytest.approx(100 / 3)
    assert scores["mmvp/color_and_appearance"] == 0.0
    assert scores["mmvp/average"] == pytest.approx((100 / 3 + 0) / 2)  # mean over categories
    assert scores["count/mmvp_pairs"] == 4


def test_pair_similarities_and_concatenation_of_stages():
    # One pair; stage 1 gets it right, stage 2 gets it wrong but less confidently: the concat is right.
    img1, txt1 = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 0.0], [0.0, 1.0]])
    img2, txt2 = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.6, 0.8], [0.8, 0.6]])
    alone = [pair_similarities(image_features=i, text_features=t) for i, t in ((img1, txt1), (img2, txt2))]
    assert alone[0][0].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert mmvp_scores(similarities=alone[1], categories=["Texts"])["mmvp/average"] == 0.0
    concat = pair_similarities(image_features=concat_stage_features([img1, img2]),
                               text_features=concat_stage_features([txt1, txt2]))
    assert np.allclose(concat, alone[0] + alone[1])  # concatenated dot product = sum of stage cosines
    assert mmvp_scores(similarities=concat, categories=["Texts"])["mmvp/average"] == 100.0


def test_tiny_writer_and_upstream_layout(tmp_path):
    info = write_tiny_mmvp(directory=tmp_path / "mmvp", pairs_per_category=2)
    pairs = read_mmvp(tmp_path / "mmvp")
    assert info["pairs"] == 18 and {p.category for p in pairs} == set(CATEGORIES)
    orientation = [p for p in pairs if p.category == "Orientation and Direction"][0]
    assert orientation.statement_a != orientation.statement_b
    assert orientation.statement_a.split()[1] == orientation.statement_b.split()[1]  # same colour
    assert len(pair_images(pairs)) == 36 and pair_statements(pairs[:1], prompt="")[0] == pairs[0].statement_a
    # The upstream MMVP_VLM layout: Questions.csv + MLLM_VLM Images/<Type>/<id>.jpg, pairs on consecutive rows.
    up = tmp_path / "upstream"
    (up / "MLLM_VLM Images" / "Texts").mkdir(parents=True)
    for qid in (1, 2):
        Image.new("RGB", (8, 8)).save(up / "MLLM_VLM Images" / "Texts" / f"{qid}.jpg")
    with open(up / "Questions.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([["Question ID", "Type", "Statement"], ["1", "Texts", "the sign says stop"],
                                      ["2", "Texts", "the sign says go"]])
    (pair,) = read_mmvp(up)
    assert pair.image_b.name == "2.jpg" and pair.statement_b == "the sign says go"
    with pytest.raises(DataError, match="eval.mmvp_dir"):
        read_mmvp(tmp_path)


def test_retrieval_recall_hand_computed():
    images = np.eye(3)
    texts = np.array([[1.0, 0, 0], [0, 0, 1.0], [0, 1.0, 0]])  # texts 1 and 2 are swapped
    recall = retrieval_recall(image_features=images, text_features=texts, ks=(1, 2))
    assert recall["retrieval/i2t_r@1"] == pytest.approx(100 / 3)
    assert recall["retrieval/t2i_r@1"] == pytest.approx(100 / 3)
    # Image 1's match (text 1) scores 0: below text 2 (1.0), tied with text 0 (ties go to the match): rank 2.
    assert recall["retrieval/i2t_r@2"] == 100.0
    shifted = retrieval_recall(image_features=images, text_features=np.roll(images, 1, axis=0), ks=(1,))
    assert shifted["retrieval/i2t_r@1"] == 0.0 and shifted["retrieval/t2i_r@1"] == 0.0
    assert recall["count/retrieval_pairs"] == 3


def test_soup_is_the_elementwise_mean():
    a = {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor(7)}
    b = {"w": torch.tensor([3.0, 5.0]), "n": torch.tensor(9)}
    soup = average_state_dicts([a, b])
    assert soup["w"].tolist() == [2.0, 4.0] and int(soup["n"]) == 7
    with pytest.raises(ValueError, match="keys"):
        average_state_dicts([a, {"w": a["w"]}])
