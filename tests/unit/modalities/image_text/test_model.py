"""open_clip model creation, block-count freezing, CLIP loss, precision, stage-model files, the training loop."""
import math
from pathlib import Path

import open_clip
import pytest
import torch
import torch.nn.functional as F

from contrastive.modalities.image_text.data import ClipBatch
from contrastive.modalities.image_text.loss import clip_loss
from contrastive.modalities.image_text.model import (TINY_MODEL, ClipSpec, create_clip, freeze_for_finetuning, load_stage_model,
                                    save_stage_model, trainable_names)
from contrastive.modalities.image_text.adapter import ClipTask, ClipTrainModule
from contrastive.engine.loop import train
from contrastive.engine.precision import autocast_context
from contrastive.engine.task import LoopSpec, OptimSpec
from contrastive.errors import ConfigError, DataError

TINY = ClipSpec(model_name=TINY_MODEL, init_seed=0, trainable_image_blocks=1)


@pytest.fixture(scope="module")
def tiny():
    return create_clip(spec=TINY)


def test_tiny_config_is_registered_and_small(tiny):
    assert TINY_MODEL in open_clip.list_models()
    assert 3.0e6 < sum(p.numel() for p in tiny.model.parameters()) < 3.8e6
    assert tiny.tokenizer(["a red striped circle"]).shape == (1, 16)
    assert tiny.model.visual.image_size == (32, 32)


def test_every_stage_starts_from_the_same_seeded_init_without_touching_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = create_clip(spec=TINY).model.state_dict()
    after = torch.rand(1)
    b = create_clip(spec=TINY).model.state_dict()
    other = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=1, trainable_image_blocks=1)).model.state_dict()
    assert torch.equal(before, after)  # the init ran under a forked RNG
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["visual.proj"], other["visual.proj"])


def test_the_seeded_init_leaves_the_gpus_generators_alone(monkeypatch):
    """The init seeds the CPU generator only (open_clip builds on the CPU): no GPU generator is reseeded, nor a
    reseed queued for when CUDA starts (torch.manual_seed does both, and fork_rng(devices=[]) undoes neither)."""
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: seeded.append(seed))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: seeded.append(seed))
    reference = create_clip(spec=TINY).model.state_dict()
    assert seeded == []
    torch.manual_seed(5)  # the caller's generators move on; the init does not follow them
    assert all(torch.equal(reference[k], v) for k, v in create_clip(spec=TINY).model.state_dict().items())


def test_freezing_counts_blocks_not_open_clip_groups(tiny):
    model = tiny.model
    names = set(trainable_names(model))
    assert names == {n for n, _ in model.named_parameters()
                     if n.startswith(("visual.transformer.resblocks.1.", "visual.ln_post.")) or
                     n in ("visual.proj", "logit_scale")}
    # The whole text tower is fixed, its final layer norm included (open_clip's freeze_layer_norm).
    assert not any(n.startswith(("transformer.", "token_embedding", "ln_final", "text_projection")) for n in names)
    # Both blocks with N = 2; open_clip's unlocked_groups=1 would have unlocked only the projection.
    assert {n.split(".")[3] for n in freeze_for_finetuning(model, trainable_image_blocks=2)
            if n.startswith("visual.transformer.")} == {"0", "1"}
    model.visual.lock(unlocked_groups=1)
    assert [n for n, p in model.visual.named_parameters() if p.requires_grad] == ["proj"]
    freeze_for_finetuning(model, trainable_image_blocks=1)
    with pytest.raises(ConfigError, match="has 2 blocks"):
        freeze_for_finetuning(model, trainable_image_blocks=3)


def test_pretrained_from_a_local_file_and_clear_errors_for_tags(tmp_path):
    source = create_clip(spec=ClipSpec(model_name=TINY_MODEL, init_seed=5, trainable_image_blocks=1)).model
    path = tmp_path / "tiny.pt"
    torch.save(source.state_dict(), path)
    loaded = create_clip(spec=ClipSpec(model_name=TINY_MODEL, pretrained=str(path), trainable_image_blocks=1))
    assert torch.equal(loaded.model.visual.proj, source.visual.proj)
    assert loaded.weights_file == str(path)
    with pytest.raises(DataError, match="neither an existing file nor a pretrained tag"):
        create_clip(spec=ClipSpec(model_name=TINY_MODEL, pretrained="openai", trainable_image_blocks=1))
    with pytest.raises(DataError, match="never downloads.*--set model.pretrained"):
        create_clip(spec=ClipSpec(model_name="ViT-B-32", pretrained="openai", cache_dir=str(tmp_path)))


def test_clip_loss_matches_a_hand_computed_case_and_open_clip():
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    text = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    scale = torch.tensor(2.0)
    # logits = 2 * I T^T = [[2, 1.2], [0, 1.6]]; image->text rows, text->image columns.
    i2t = (-math.log(math.exp(2) / (math.exp(2) + math.exp(1.2))) - math.log(math.exp(1.6) / (1 + math.exp(1.6)))) / 2
    t2i = (-math.log(math.exp(2) / (math.exp(2) + 1)) - math.log(math.exp(1.6) / (math.exp(1.2) + math.exp(1.6)))) / 2
    assert clip_loss(image_features=image, text_features=text, logit_scale=scale).item() == pytest.approx(
        (i2t + t2i) / 2, rel=1e-6)
    gen = torch.Generator().manual_seed(0)
    a, b = (F.normalize(torch.randn(8, 4, generator=gen), dim=1) for _ in range(2))
    reference = open_clip.ClipLoss()(a, b, torch.tensor(10.0))
    assert clip_loss(image_features=a, text_features=b, logit_scale=torch.tensor(10.0)).item() == pytest.approx(
        reference.item(), rel=1e-6)


def _batch(n: int, seed: int = 0) -> ClipBatch:
    gen = torch.Generator().manual_seed(seed)
    colors = ["red", "green", "blue", "yellow"]
    return ClipBatch(images=torch.randn(n, 3, 32, 32, generator=gen),
                     texts=[f"a {colors[i % 4]} thing number {i}" for i in range(n)], keys=[str(i) for i in range(n)])


def test_grad_checkpointing_keeps_gradients_of_blocks_above_frozen_ones():
    grads = {}
    for checkpointing in (False, True):
        bundle = create_clip(spec=TINY)
        bundle.model.set_grad_checkpointing(checkpointing)
        module = ClipTrainModule(bundle.model, text_frozen=True)
        loss = clip_step_loss(module, bundle, _batch(6))
        loss.backward()
        grads[checkpointing] = {n: p.grad for n, p in bundle.model.named_parameters() if p.requires_grad}
    assert all(g is not None and g.abs().sum() > 0 for n, g in grads[True].items() if n != "logit_scale")
    assert all(torch.allclose(grads[True][n], grads[False][n], atol=1e-6) for n in grads[False])


def test_precision_contexts_on_cpu():
    cpu = torch.device("cpu")
    with autocast_context(precision="bf16", device=cpu):
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast_context(precision="amp", device=cpu):  # float16 autocast is CUDA-only here
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    with autocast_context(precision="fp16", device=cpu):  # fp16 is amp's other name
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(ConfigError, match="fp32, bf16, fp16, amp"):
        autocast_context(precision="fp8", device=cpu)
    bundle = create_clip(spec=TINY)
    with autocast_context(precision="bf16", device=cpu):
        loss = clip_step_loss(ClipTrainModule(bundle.model, text_frozen=True), bundle, _batch(4))
    assert torch.isfinite(loss) and loss.dtype == torch.float32


def test_stage_model_file_stores_only_trained_parameters(tmp_path, tiny):
    with torch.no_grad():
        tiny.model.visual.proj.add_(1.0)
    path = save_stage_model(model=tiny.model, spec=TINY, path=tmp_path / "model.pt", weights_file=None)
    saved = torch.load(path, weights_only=True)
    assert set(saved["trainable_state"]) == set(trainable_names(tiny.model))
    loaded = load_stage_model(path=path)
    state, original = loaded.model.state_dict(), tiny.model.state_dict()
    assert all(torch.equal(state[k], original[k]) for k in original)
    with pytest.raises(DataError, match="missing"):
        load_stage_model(path=tmp_path / "nope.pt")


def test_a_model_soup_names_its_stage_models_relative_to_itself(tmp_path, tiny):
    """The soup is kept in the run directory, which moves (issue 47): the stage models it averages are noted
    relative to its own directory, never as paths of the machine that made it."""
    from contrastive.modalities.image_text.steps import make_soup
    steps = tmp_path / "runs" / "steps"
    stages = [save_stage_model(model=tiny.model, spec=TINY, path=steps / f"clip-train{i}-k" / "model" / "model.pt",
                               weights_file=None) for i in range(2)]
    soup = Path(make_soup(model_paths=[str(p) for p in stages], out_path=str(steps / "clip-soup-k" / "model.pt")))
    assert str(tmp_path).encode() not in soup.read_bytes()
    assert torch.load(soup, weights_only=True)["soup_of"] == ["../clip-train0-k/model/model.pt",
                                                              "../clip-train1-k/model/model.pt"]


class ListSource:
    def __init__(self, batches):
        self.items = batches

    def __len__(self):
        return len(self.items)

    def batches(self, *, epoch, start):
        return iter(self.items[start:])


def clip_step_loss(module, bundle, batch):
    """The CLIP loss of one batch through the training module (what the engine's forward computes)."""
    loss, _ = module(batch.images, bundle.tokenizer(batch.texts))
    return loss


def _train(tmp_path, *, stop_after=None, name="ckpt"):
    bundle = create_clip(spec=TINY)
    batches = [_batch(8, seed) for seed in range(3)]
    result = train(task=ClipTask(bundle=bundle), source=ListSource(batches),
                   optim=OptimSpec(name="adamw", lr=1e-3, weight_decay=0.1, warmup_fraction=0.2, schedule="cosine",
                                   betas=(0.9, 0.98), eps=1e-6),
                   loop=LoopSpec(epochs=2, checkpoint_every_steps=2, log_every_steps=1), device=torch.device("cpu"),
                   checkpoint_path=tmp_path / name / "last.pt", stop_after_steps=stop_after)
    return bundle, result


def test_training_moves_only_trainable_parameters_and_resumes_exactly(tmp_path):
    init = create_clip(spec=TINY).model.state_dict()
    bundle, result = _train(tmp_path)
    assert result.steps == 6 and math.isfinite(result.final_loss)
    trained = bundle.model.state_dict()
    trainable = set(trainable_names(bundle.model))
    changed = {k for k in init if not torch.equal(init[k], trained[k])}
    assert changed and changed <= trainable
    _, partial = _train(tmp_path, stop_after=4, name="crash")
    assert partial.steps == 4
    resumed, rest = _train(tmp_path, name="crash")
    assert rest.resumed_from_step == 4 and rest.steps == 6
    assert all(torch.allclose(resumed.model.state_dict()[k], trained[k], atol=1e-6) for k in trainable)
