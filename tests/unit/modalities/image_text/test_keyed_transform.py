"""Per-sample augmentation: a function of (seed, epoch, key) only, on any thread, in any order."""
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from contrastive.modalities.image_text.data import SkipCounter, stream_batches, write_tiny_shards
from contrastive.modalities.image_text.keyed_transform import KeyedTransform, crop_box, sample_generator


def _image(seed: int = 0, size: int = 48) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size + 16, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_crop_box_stays_inside_the_image_and_within_scale():
    generator = np.random.default_rng(0)
    for _ in range(200):
        top, left, h, w = crop_box(height=40, width=60, scale=(0.3, 0.9), ratio=(3 / 4, 4 / 3), generator=generator)
        assert 0 <= top and top + h <= 40 and 0 <= left and left + w <= 60
        assert 0.3 * 2400 * 0.8 <= h * w <= 0.9 * 2400 * 1.2  # rounding of sides moves the area a little


def test_impossible_ratio_falls_back_to_the_largest_centre_crop():
    box = crop_box(height=10, width=100, scale=(0.99, 1.0), ratio=(1.0, 1.0), generator=np.random.default_rng(0))
    assert box == (0, 45, 10, 10)


def test_same_key_same_view_other_key_or_epoch_other_view():
    compose = T.Compose([T.RandomResizedCrop(24, scale=(0.2, 1.0)), T.ColorJitter(0.4, 0.4, 0.4),
                         T.RandomGrayscale(0.5), T.ToTensor()])
    image = _image()
    first = KeyedTransform(compose, seed=1, epoch=0)
    assert torch.equal(first(image, "a"), first(image, "a"))
    assert torch.equal(first(image, "a"), KeyedTransform(compose, seed=1, epoch=0)(image, "a"))
    assert not torch.equal(first(image, "a"), first(image, "b"))
    assert not torch.equal(first(image, "a"), KeyedTransform(compose, seed=1, epoch=1)(image, "a"))
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    first(image, "a")
    assert torch.equal(torch.rand(3), before)  # the caller's global generator is left as it was


def test_the_order_of_decoding_does_not_change_the_views():
    compose = T.Compose([T.RandomResizedCrop(16, scale=(0.2, 1.0)), T.RandomHorizontalFlip(), T.ToTensor()])
    keyed = KeyedTransform(compose, seed=0, epoch=3)
    items = [(str(i), _image(i)) for i in range(40)]
    in_order = [keyed(image, key) for key, image in items]
    backwards = [keyed(image, key) for key, image in reversed(items)][::-1]
    assert all(torch.equal(a, b) for a, b in zip(in_order, backwards))
    assert not all(torch.equal(in_order[0], v) for v in in_order[1:])
    draws = {key: sample_generator(seed=0, epoch=3, key=key).random(2).tolist() for key in ("7", "8")}
    assert draws["7"] == sample_generator(seed=0, epoch=3, key="7").random(2).tolist() != draws["8"]


def test_stage0_batches_equal_with_and_without_decode_workers(tmp_path):
    shards = write_tiny_shards(directory=tmp_path / "shards", num_samples=24, samples_per_shard=8, seed=1)
    transform = T.Compose([T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.ToTensor()])

    def read(workers: int) -> list:
        return list(stream_batches(urls=shards["urls"], batch_size=4, transform=transform,
                                   counter=SkipCounter(max_skip_fraction=0.5), seed=2, epoch=0, shuffle_buffer=6,
                                   workers=workers))
    inline, threaded = read(0), read(3)
    assert [b.keys for b in inline] == [b.keys for b in threaded] and len(inline) >= 4
    assert all(torch.equal(a.images, b.images) for a, b in zip(inline, threaded))


@pytest.mark.parametrize("size", [8, 31])
def test_matches_torchvision_resized_crop_for_the_drawn_box(size):
    image = _image(size=40)
    op = T.RandomResizedCrop(size, scale=(0.3, 1.0))
    got = KeyedTransform(T.Compose([op, T.PILToTensor()]), seed=4, epoch=0)(image, "k")
    top, left, h, w = crop_box(height=40, width=56, scale=op.scale, ratio=op.ratio,
                               generator=sample_generator(seed=4, epoch=0, key="k"))
    expected = T.PILToTensor()(T.functional.resized_crop(image, top, left, h, w, [size, size], op.interpolation))
    assert torch.equal(got, expected)


def test_colour_ops_follow_torchvision_with_the_drawn_parameters():
    """ColorJitter: factors ~ U(range) in a random order of the four adjustments; RandomGrayscale: one uniform draw
    against p. Reproduced by hand from the same per-sample stream."""
    image = _image(3, size=24)
    jitter, gray = T.ColorJitter(0.4, 0.3, 0.2, 0.1), T.RandomGrayscale(0.5)
    got = KeyedTransform(T.Compose([jitter, gray, T.PILToTensor()]), seed=5, epoch=2)(image, "x")
    draws = sample_generator(seed=5, epoch=2, key="x")
    factors = [draws.uniform(0.6, 1.4), draws.uniform(0.7, 1.3), draws.uniform(0.8, 1.2), draws.uniform(-0.1, 0.1)]
    adjust = [T.functional.adjust_brightness, T.functional.adjust_contrast, T.functional.adjust_saturation,
              T.functional.adjust_hue]
    expected = image
    for index in draws.permutation(4):
        expected = adjust[index](expected, factors[index])
    if draws.random() < 0.5:
        expected = T.functional.rgb_to_grayscale(expected, num_output_channels=3)
    assert torch.equal(got, T.PILToTensor()(expected))


def test_open_clip_colour_ops_are_keyed_too():
    import open_clip.transform as open_clip_transform  # a dependency of mclpipe itself
    compose = T.Compose([T.RandomResizedCrop(16, scale=(0.5, 1.0)),
                         open_clip_transform.color_jitter(0.4, 0.4, 0.4, 0.1, p=0.8),
                         open_clip_transform.gray_scale(p=0.5), T.ToTensor()])
    keyed = KeyedTransform(compose, seed=0, epoch=0)
    views = [keyed(_image(i), str(i)) for i in range(12)]
    assert all(torch.equal(v, keyed(_image(i), str(i))) for i, v in enumerate(views))
    grey = [bool(torch.equal(v[0], v[1]) and torch.equal(v[1], v[2])) for v in views]
    assert any(grey) and not all(grey)  # p = 0.5 over 12 samples: both outcomes occur


def test_decode_threads_leave_the_training_threads_draws_alone():
    """The training thread's global-generator draws are the same while decode threads augment (the old
    seed-and-restore of the global generator could rewind them)."""
    import threading
    import time

    def draws() -> list[torch.Tensor]:  # the sleeps let the decode threads run between the draws
        out = []
        for _ in range(300):
            out.append(torch.rand(4))
            time.sleep(0.0002)
        return out
    compose = T.Compose([T.RandomResizedCrop(16), T.ColorJitter(0.4, 0.4, 0.4), T.RandomGrayscale(0.5),
                         T.RandomHorizontalFlip(), T.ToTensor()])
    keyed = KeyedTransform(compose, seed=0, epoch=0)
    torch.manual_seed(7)
    alone = draws()
    stop = threading.Event()

    def decode():
        while not stop.is_set():
            keyed(_image(1), "k")
    threads = [threading.Thread(target=decode) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        torch.manual_seed(7)
        beside = draws()  # the old seed-and-restore code matched 2 of 300
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert all(torch.equal(a, b) for a, b in zip(alone, beside))


def test_an_unknown_random_op_is_refused_with_the_fix():
    from contrastive.errors import ConfigError
    with pytest.raises(ConfigError, match="RandomRotation.*aug_cfg"):
        KeyedTransform(T.Compose([T.RandomApply([T.RandomRotation(10)], p=0.5), T.ToTensor()]), seed=0, epoch=0)


def test_uint8_images_normalised_per_batch_equal_the_float_transform_bit_for_bit():
    """open_clip's train transform ends with ToTensor + Normalize: the keyed transform can stop before them (uint8
    batches, 4x less to stack and copy to a GPU) and normalize_batch gives the same floats for the whole batch."""
    import numpy as np
    import torch
    from open_clip import image_transform
    from PIL import Image

    from contrastive.modalities.image_text.keyed_transform import KeyedTransform, normalize_batch

    transform = image_transform(32, is_train=True)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(3)]
    floats = KeyedTransform(transform, seed=1, epoch=2)
    uint8 = KeyedTransform(transform, seed=1, epoch=2, uint8=True)
    assert floats.normalization is None and uint8.normalization is not None
    want = torch.stack([floats(image, f"k{i}") for i, image in enumerate(images)])
    got = torch.stack([uint8(image, f"k{i}") for i, image in enumerate(images)])
    assert got.dtype == torch.uint8 and got.shape == want.shape
    assert torch.equal(normalize_batch(got, uint8.normalization), want)
