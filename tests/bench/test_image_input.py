"""The input benchmark's bookkeeping (bench/image_input.py): its JPEGs, the CPU time of worker processes, ratios
per CPU-second (the benchmark itself runs in `make bench`)."""
import os

from PIL import Image

from bench import image_input


def test_it_writes_imagenet_size_jpegs_in_class_folders(tmp_path):
    image_input.write_jpegs(tmp_path, num_images=3)
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == 3 and {f.parent.name for f in files} == {"class0", "class1", "class2"}
    assert [Image.open(f).size for f in files] == [(500, 375), (375, 500), (500, 375)]


def test_cpu_seconds_of_processes_and_ratios_per_cpu_second():
    sum(i * i for i in range(200_000))  # spend some CPU
    assert image_input._cpu_seconds([os.getpid()]) > 0 and image_input._cpu_seconds([2 ** 22 + 7]) == 0
    run = {"images": 100, "seconds": 1.0}
    runs = {"baseline": [{**run, "cpu_seconds": 2.0}] * 3, "ours": [{**run, "cpu_seconds": 0.5}] * 3,
            "ours + crop on host": [{**run, "cpu_seconds": 1.0}] * 3,
            "ours, decode_scale=full": [{**run, "cpu_seconds": 4.0}] * 3}
    startup = {name: 1.0 for name in runs}
    rows = image_input.results(runs=runs, startup=startup, workers=1, num_images=100, note="", decode_floor=5.0)
    assert [round(r.ratio, 2) for r in rows] == [4.0, 2.0, 0.5]  # the same wall time: per CPU-second decides
    assert rows[0].passed is True and rows[1].passed is None
    # baseline 20 ms an image against a 5 ms decode floor: no whole-image CPU decoder gets past 4x
    assert "at most 4.00x the baseline per core" in rows[0].notes[1] and "ours 5.00 ms" in rows[0].notes[1]


def test_decode_floor_times_libjpeg_turbo_alone(tmp_path):
    image_input.write_jpegs(tmp_path, num_images=2)
    assert 0 < image_input.decode_floor_ms(tmp_path, passes=1) < 1_000
