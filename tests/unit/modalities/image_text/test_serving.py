"""The image-text modality's registered model: a self-contained copy of a stage (full weights, no init file
needed) that embeds user images as the export embeds the shards."""
import numpy as np
import torch
from PIL import Image

from contrastive.modalities.image_text.evaluate import encode_images
from contrastive.modalities.image_text.model import TINY_MODEL, ClipSpec, create_clip, save_stage_model
from contrastive.modalities.image_text.serving import embed, load_encoder, write_serving_file


def test_the_serving_copy_loads_without_the_init_weights_and_embeds_like_the_export(tmp_path):
    init = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=7, trainable_image_blocks=1))
    with torch.no_grad():  # init weights unlike the seeded random init, so a missing file would show
        for p in init.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    torch.save(init.model.state_dict(), tmp_path / "init.pt")
    bundle = create_clip(spec=ClipSpec(model_name=TINY_MODEL, pretrained=str(tmp_path / "init.pt"),
                                       trainable_image_blocks=1))
    with torch.no_grad():  # "training": the trainable parameters move
        for p in bundle.model.parameters():
            if p.requires_grad:
                p.mul_(1.1)
    model_path = save_stage_model(model=bundle.model, spec=bundle.spec, path=tmp_path / "stage0" / "model" / "model.pt",
                                  weights_file=bundle.weights_file)
    served = write_serving_file(str(model_path), out_dir=tmp_path / "serving")
    (tmp_path / "init.pt").unlink()

    images = np.random.default_rng(0).integers(0, 256, size=(3, 40, 30, 3), dtype=np.uint8)
    bundle.model.eval()
    expected = encode_images(model=bundle.model, images=[Image.fromarray(i) for i in images],
                             transform=bundle.eval_transform, device=torch.device("cpu"))
    encoder = load_encoder(served)
    np.testing.assert_allclose(embed(encoder, images), expected, atol=1e-5)
    np.testing.assert_allclose(embed(encoder, images.transpose(0, 3, 1, 2)), expected, atol=1e-5)  # NCHW too
    assert np.allclose(np.linalg.norm(expected, axis=1), 1.0, atol=1e-5)
