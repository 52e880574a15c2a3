"""The ``photos`` preset (your own photos in one command): listed, refused in one line until its source is set,
and on a folder of real JPEGs in the standard layout (``<class>/*.jpg``) or flat (no labels) it prepares 128 px
images and checks its K x batch capacity against the folder, as its comment says."""
import numpy as np
import pytest
from PIL import Image

from contrastive.errors import ConfigError
from pipeline_config.loader import load_config, preset_names

CLASSES = ("beach", "city", "forest")


def _photos(root, *, per_class: int = 12, flat: bool = False):
    """JPEGs of mixed sizes and orientations (as a camera writes them), one colour family per class."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        folder = root if flat else root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = (240, 180) if i % 2 else (180, 240)
            pixels = rng.integers(0, 60, size=(h, w, 3), dtype=np.uint8)
            pixels[..., c] += 150
            Image.fromarray(pixels).save(folder / f"{name}_{i:03d}.jpg", quality=85)
    return root


def _config(tmp_path, source, *overrides):
    return load_config("photos", [f"data.image_folder.source={source}", f"data.cache_dir={tmp_path / 'cache'}",
                                  f"output_dir={tmp_path / 'runs'}", *overrides])


def test_photos_is_a_preset_that_names_its_source_key_until_it_is_set():
    from contrastive.modalities.image.modality import ImageModality
    assert "photos" in preset_names()
    config = load_config("photos")
    assert (config.data.kind, config.data.image_folder.image_size, config.model.encoder) == \
        ("image_folder", 128, "resnet18")
    with pytest.raises(ConfigError, match=r"--set data\.image_folder\.source="):
        ImageModality().preflight(config)


def test_a_folder_of_class_subfolders_prepares_128px_photos_with_their_class(tmp_path):
    from contrastive.data.loading import load_dataset
    from contrastive.modalities.image.modality import ImageModality
    source = _photos(tmp_path / "photos")
    modality = ImageModality()
    config = _config(tmp_path, source)
    modality.preflight(config)
    # 36 photos hold fewer than K x batch = 2,560 training photos: refused, naming the keys that fix it
    with pytest.raises(ConfigError, match=r"train\.batch_size"):
        modality.prepare_data(config, log=lambda line: None)
    small = _config(tmp_path, source, "train.batch_size=8", "mcl.clusters=[2]")
    data = modality.prepare_data(small, log=lambda line: None)
    assert data["num_train"] + data["num_test"] == 36 and data["attributes"] == ["class"]
    dataset = load_dataset(data["dir"])
    assert dataset.class_names == {"class": list(CLASSES)}
    assert dataset.images.shape[1:] == (128, 128, 3)


def test_labels_are_optional(tmp_path):
    from contrastive.modalities.image.modality import ImageModality
    source = _photos(tmp_path / "flat", flat=True)
    data = ImageModality().prepare_data(_config(tmp_path, source, "train.batch_size=8", "mcl.clusters=[2]"),
                                        log=lambda line: None)
    assert data["num_train"] + data["num_test"] == 36 and data["attributes"] == []


def test_the_preset_holds_from_k_times_batch_training_photos():
    """Its comment's sizing: K = 10 clusters of batches of 256 need 2,560 training photos."""
    from contrastive.modalities.image.config import check_feasible
    config = load_config("photos")
    k, batch = config.mcl.clusters[0], config.train.batch_size
    check_feasible(config, num_train=k * batch)
    with pytest.raises(ConfigError, match="mcl.clusters|train.batch_size"):
        check_feasible(config, num_train=k * batch - 1)
    assert k * batch == 2560
