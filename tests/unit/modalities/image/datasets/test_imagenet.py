"""ImageNet / ImageNet-100 from class folders: the file index, the class list, decoding when read."""
import numpy as np
import pytest
from PIL import Image

from contrastive.modalities.image.datasets.imagenet import prepare_imagenet
from contrastive.data.loading import load_dataset
from contrastive.errors import ConfigError, DataError

WNIDS = ["n01440764", "n01443537", "n01484850"]


def write_imagenet(root):
    for top, per_class in (("train", 3), ("val", 1)):
        for c, wnid in enumerate(WNIDS):
            (root / top / wnid).mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (40, 30), (80 * c, 10 * i, 200)).save(root / top / wnid / f"{wnid}_{i}.JPEG")


def test_all_classes_and_a_class_list(tmp_path):
    write_imagenet(tmp_path / "imagenet")
    ds = load_dataset(prepare_imagenet(source=tmp_path / "imagenet", root=tmp_path / "cache", image_size=16))
    assert len(ds.indices("train")) == 9 and len(ds.indices("test")) == 3
    assert ds.class_names["class"] == WNIDS
    row = int(np.flatnonzero(ds.ids == f"val/{WNIDS[2]}/{WNIDS[2]}_0.JPEG")[0])
    assert ds.split[row] == "test" and ds.labels["class"][row] == 2
    pixel = ds.get_batch([row])[0, :, 8, 8].tolist()  # decoded when read, resized to 16 px
    assert abs(pixel[0] - 160) <= 4 and abs(pixel[2] - 200) <= 4
    listed = tmp_path / "imagenet100.txt"
    listed.write_text(f"# two classes\n{WNIDS[2]}\n{WNIDS[0]} extra column\n")
    sub = load_dataset(prepare_imagenet(source=tmp_path / "imagenet", root=tmp_path / "cache", image_size=16,
                                        class_list=listed))
    assert sub.class_names["class"] == [WNIDS[0], WNIDS[2]] and len(sub) == 8


def test_errors_name_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"image-net.org.*--set data.imagenet.root"):
        prepare_imagenet(source=tmp_path, root=tmp_path / "cache")
    write_imagenet(tmp_path)
    listed = tmp_path / "list.txt"
    listed.write_text("n99999999\n")
    with pytest.raises(DataError, match="class_list"):
        prepare_imagenet(source=tmp_path, root=tmp_path / "cache", class_list=listed)
    with pytest.raises(ConfigError, match="does not exist"):
        prepare_imagenet(source=tmp_path, root=tmp_path / "cache", class_list=tmp_path / "none.txt")
