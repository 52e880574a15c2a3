"""The hierarchical Trifeature data: families share texture and close hues, members differ by shape and hue."""
import colorsys

import numpy as np
import pytest

from contrastive.modalities.image.datasets.hierarchical import HierarchySpec, generate_hierarchical, prepare_hierarchical
from contrastive.data.loading import load_dataset
from contrastive.errors import ConfigError


def test_labels_are_a_two_level_hierarchy_and_deterministic():
    spec = HierarchySpec(families=3, members=4)
    images, labels = generate_hierarchical(num_train=300, num_test=60, spec=spec, seed=5)
    again, _ = generate_hierarchical(num_train=300, num_test=60, spec=spec, seed=5)
    assert images.shape == (360, 32, 32, 3) and np.array_equal(images, again)
    assert np.array_equal(labels["coarse"], labels["fine"] // 4) and np.array_equal(labels["shape"],
                                                                                      labels["fine"] % 4)
    assert set(np.unique(labels["fine"])) == set(range(12))
    assert not np.array_equal(images, generate_hierarchical(num_train=300, num_test=60, spec=spec, seed=6)[0])


def test_palette_hues_are_close_inside_a_family_and_apart_across():
    spec = HierarchySpec(families=4, members=3, hue_spread=0.03)
    hues = [colorsys.rgb_to_hsv(*(spec.palette()[y] / 255))[0] for y in range(12)]

    def distance(a, b):
        d = abs(a - b) % 1.0
        return min(d, 1 - d)

    for y in range(12):
        f, m = divmod(y, 3)
        assert distance(hues[y], f / 4 + (m - 1) * 0.03) < 1e-3  # hue(y) = f / F + (m - (M - 1) / 2) x spread
    within = max(distance(hues[a], hues[b]) for a in range(12) for b in range(12) if a // 3 == b // 3)
    across = min(distance(hues[a], hues[b]) for a in range(12) for b in range(12) if a // 3 != b // 3)
    assert within == pytest.approx(0.06, abs=1e-3) and across > within


def test_each_image_shows_its_fine_class_colour():
    """Inside the shape every pixel is the class colour times a shade: its hue is the class hue, and the nearest
    palette hue is that of the image's own fine class, never a sibling's (0.04 turn away)."""
    spec = HierarchySpec()
    images, labels = generate_hierarchical(num_train=40, num_test=0, spec=spec, seed=1)
    palette_hues = np.array([colorsys.rgb_to_hsv(*(c / 255))[0] for c in spec.palette()])
    for image, fine in zip(images.astype(float) / 255, labels["fine"]):
        hsv = np.array([colorsys.rgb_to_hsv(*p) for p in image.reshape(-1, 3)])
        hue = hsv[hsv[:, 1].argmax(), 0]  # the most saturated pixel: inside the shape, not blended with grey
        distance = np.abs(palette_hues - hue) % 1.0
        assert np.minimum(distance, 1 - distance).argmin() == fine


def test_prepared_dataset_loads_with_fine_and_coarse_labels(tmp_path):
    spec = HierarchySpec(families=2, members=2)
    path = prepare_hierarchical(root=tmp_path, num_train=20, num_test=8, spec=spec, seed=0)
    assert prepare_hierarchical(root=tmp_path, num_train=20, num_test=8, spec=spec, seed=0) == path  # reused
    dataset = load_dataset(path)
    assert dataset.attributes == ["fine", "coarse", "shape"] and len(dataset.indices("test")) == 8
    assert dataset.class_names["coarse"] == ["stripes_0", "stripes_45"]
    assert np.array_equal(dataset.labels["coarse"], dataset.labels["fine"] // 2)


def test_invalid_hierarchies_name_the_fix():
    with pytest.raises(ConfigError, match="lower hue_spread"):
        HierarchySpec(families=4, members=4, hue_spread=0.1)
    with pytest.raises(ConfigError, match="families"):
        HierarchySpec(families=1)


def test_config_option_keeps_earlier_keys_and_the_preset_loads():
    from pipeline_config.loader import load_config
    from contrastive.modalities.image.config import TrifeatureConfig
    assert "hierarchy" not in TrifeatureConfig().content()
    config = load_config("hierarchy_simclr_hex")
    assert config.data.trifeature.hierarchy.families == 4 and config.method.hex.weighting == "hard_negative"
    assert "hierarchy" in config.data.trifeature.content()
