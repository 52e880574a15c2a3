"""MoCo-v2 and NNCLR state (queues, momentum encoder) against hand-written references; every method trains
through the real loop and resumes from a checkpoint with its queues restored."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from contrastive.methods.hex import HexRule, QRule
from contrastive.methods import MoCoV2, NNCLR, SimCLR, build_method
from contrastive.models import ProjectionHead, SmallCNN
from contrastive.engine.rng import seed_everything
from tests.unit.modalities.image.training import train_on_images

MODEL = dict(encoder="small_cnn", widths=[4, 8], projection_hidden=8, projection_dim=4)
HEX = {"enabled": True, "epsilon": {"mode": "cosine", "start": 0.9, "end": 0.1}, "q": {"mode": "similarity"}}


def tiny_parts(dim=4):
    backbone = SmallCNN(widths=[4])
    return backbone, ProjectionHead(in_dim=4, hidden_dim=8, out_dim=dim)


# ---------------------------------------------------------------------------------------------------- NNCLR
def test_nnclr_support_set_is_a_fifo_of_normalised_projections():
    backbone, head = tiny_parts(dim=3)
    method = NNCLR(backbone=backbone, head=head, predictor=torch.nn.Identity(), dim=3, temperature=0.1,
                   queue_size=5)
    batches = [torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3), torch.randn(7, 3)]
    reference: list[torch.Tensor] = []  # hand-written FIFO: newest last, at most 5
    for number, batch in enumerate(batches[:3]):
        method.enqueue(batch)
        reference = (reference + list(F.normalize(batch, dim=1)))[-5:]
        assert int(method.support_count) == min(5, 2 * (number + 1))
    # slots 0..4 hold rows 0..4 of the stream, then row 5 overwrote slot 0
    stream = F.normalize(torch.cat(batches[:3]), dim=1)
    assert torch.allclose(method.support, torch.cat([stream[5:6], stream[1:5]]))
    assert int(method.support_ptr) == 1
    assert {tuple(v.tolist()) for v in method.support} == {tuple(v.tolist()) for v in reference}
    method.enqueue(batches[3])  # more than K rows at once: keep the newest K
    newest = F.normalize(batches[3][-5:], dim=1)
    assert {tuple(v.tolist()) for v in method.support} == {tuple(v.tolist()) for v in newest}


def test_nnclr_nearest_neighbour_matches_a_loop():
    backbone, head = tiny_parts(dim=3)
    method = NNCLR(backbone=backbone, head=head, predictor=torch.nn.Identity(), dim=3, temperature=0.1,
                   queue_size=8)
    query = torch.randn(4, 3)
    assert torch.allclose(method.nearest_neighbours(query), F.normalize(query, dim=1))  # empty: NN(z) = z
    support = torch.randn(5, 3)
    method.enqueue(support)  # 5 of 8 slots filled: the 3 zero slots must never be chosen
    unit = F.normalize(support, dim=1)
    for row, z in zip(method.nearest_neighbours(query), query):
        cosines = [float(F.cosine_similarity(z, s, dim=0)) for s in support]
        assert torch.allclose(row, unit[int(np.argmax(cosines))])


def test_nnclr_loss_is_the_symmetric_paper_loss():
    seed_everything(0)
    method = build_method(model_kwargs=MODEL, method_kwargs={"name": "nnclr", "temperature": 0.1,
                                                             "nnclr": {"queue_size": 16, "predictor_hidden": 8}})
    method.enqueue(torch.randn(16, 4))
    method.eval()  # fixed BN statistics so the reference forward sees the same numbers
    v1, v2 = torch.rand(5, 3, 8, 8), torch.rand(5, 3, 8, 8)
    support_before = method.support.clone()
    loss, _ = method.training_loss(v1, v2, step=0)
    z1, z2 = method.head(method.backbone(v1)), method.head(method.backbone(v2))
    p1, p2 = method.predictor(z1), method.predictor(z2)

    def one_way(z, p):
        unit = F.normalize(support_before, dim=1)
        nn_ = unit[(F.normalize(z, dim=1) @ unit.T).argmax(1)]
        return F.cross_entropy(nn_ @ F.normalize(p, dim=1).T / 0.1, torch.arange(5))

    assert torch.allclose(loss, 0.5 * (one_way(z1, p2) + one_way(z2, p1)), atol=1e-5)
    assert torch.allclose(method.support[:5], F.normalize(z1, dim=1), atol=1e-6)  # z1 enqueued after the loss


# ---------------------------------------------------------------------------------------------------- MoCo
def test_moco_momentum_update_closed_form():
    backbone, head = tiny_parts()
    method = MoCoV2(backbone=backbone, head=head, dim=4, temperature=0.2, queue_size=8, momentum=0.9)
    assert all(torch.equal(k, q) for k, q in zip(method.key_parameters(), method.query_parameters()))
    assert not any(p.requires_grad for p in method.key_parameters())
    with torch.no_grad():
        for p in method.query_parameters():
            p.add_(torch.randn_like(p))
    before_k = [p.clone() for p in method.key_parameters()]
    query = [p.clone() for p in method.query_parameters()]
    method.after_optimizer_step(step=0)
    for k_new, k_old, q in zip(method.key_parameters(), before_k, query):
        assert torch.allclose(k_new, 0.9 * k_old + 0.1 * q, atol=1e-6)


def test_moco_queue_is_fifo_with_groups():
    backbone, head = tiny_parts(dim=2)
    method = MoCoV2(backbone=backbone, head=head, dim=2, temperature=0.2, queue_size=4, momentum=0.99)
    keys = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    method.enqueue(keys=keys[:3], groups=torch.tensor([7, 8, 9]))
    assert torch.equal(method.queue[:3], keys[:3]) and int(method.queue_ptr) == 3
    method.enqueue(keys=keys[3:5])  # wraps: slot 3, then slot 0; no groups = unknown (-1)
    assert torch.equal(method.queue, torch.stack([keys[4], keys[1], keys[2], keys[3]]))
    assert method.queue_groups.tolist() == [-1, 8, 9, -1] and int(method.queue_ptr) == 1


def test_moco_loss_uses_the_queue_before_this_batch_and_enqueues_both_views():
    seed_everything(0)
    method = build_method(model_kwargs=MODEL, method_kwargs={"name": "moco_v2", "temperature": 0.2,
                                                             "moco": {"queue_size": 32, "momentum": 0.99}})
    method.eval()
    v1, v2 = torch.rand(3, 3, 8, 8), torch.rand(3, 3, 8, 8)
    queue = method.queue.clone()
    loss, _ = method.training_loss(v1, v2, step=0)
    q1, q2 = (F.normalize(method.head(method.backbone(v)), dim=1) for v in (v1, v2))
    k1, k2 = (F.normalize(method.key_head(method.key_backbone(v)), dim=1) for v in (v1, v2))

    def one_way(q, k):
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / 0.2
        return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))

    assert torch.allclose(loss, 0.5 * (one_way(q1, k2) + one_way(q2, k1)), atol=1e-5)
    assert torch.allclose(method.queue[:6], torch.cat([k1, k2]), atol=1e-6) and int(method.queue_ptr) == 6


def test_hex_changes_the_moco_loss_and_logs_its_numbers():
    seed_everything(0)
    plain = build_method(model_kwargs=MODEL, method_kwargs={"name": "moco_v2", "temperature": 0.2,
                                                            "moco": {"queue_size": 32}})
    hexed = copy.deepcopy(plain)
    hexed.hex_rule = HexRule(q=QRule(value=0.0))  # adaptive epsilon at the 90th percentile, hierarchy removed
    plain.eval(), hexed.eval()
    v1, v2 = torch.rand(4, 3, 8, 8), torch.rand(4, 3, 8, 8)
    plain_loss, plain_stats = plain.training_loss(v1, v2, step=0)
    hex_loss, stats = hexed.training_loss(v1, v2, step=0)
    assert plain_stats == {} and hex_loss < plain_loss  # Q = 0 removes the hardest 10% of the queue
    assert 0 < stats["hex/mean_hierarchy_size"] < 32 and stats["hex/q_mean"] == 0.0 and "hex/epsilon" in stats


# ---------------------------------------------------------------------------------------------------- training
def _train(tmp_path, method_kwargs, *, stop_after_steps=None, with_groups=False):
    images = torch.randint(0, 255, (48, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    groups = np.repeat(np.arange(3), 16)
    return train_on_images(checkpoint_dir=tmp_path / "ckpt", method_kwargs=method_kwargs, images=images,
                           hex_groups=groups if with_groups else None, stop_after_steps=stop_after_steps)


CASES = {
    "simclr": {"name": "simclr", "temperature": 0.5},
    "simclr_hex": {"name": "simclr", "temperature": 0.5, "hex": HEX},
    "moco_v2_hex": {"name": "moco_v2", "temperature": 0.5, "moco": {"queue_size": 20, "momentum": 0.9},
                    "hex": {"enabled": True, "epsilon": {"mode": "adaptive", "percentile": 80}}},
    "nnclr_hex_groups": {"name": "nnclr", "temperature": 0.5, "nnclr": {"queue_size": 20, "predictor_hidden": 8},
                         "hex": {"enabled": True, "hierarchy": "earlier_clusters", "q": {"value": 0.2}}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_trains_and_resumes_with_queues_restored(tmp_path, case):
    kwargs, with_groups = CASES[case], case.endswith("groups")
    full_model, full = _train(tmp_path / "full", kwargs, with_groups=with_groups)
    assert np.isfinite(full.final_loss) and full.steps == 12
    if kwargs.get("hex"):
        logged = full.history[-1]
        assert {"hex/epsilon", "hex/mean_hierarchy_size", "hex/q_mean", "hex/from_groups"} <= set(logged)
        assert logged["hex/from_groups"] == float(with_groups)
    _, partial = _train(tmp_path / "crash", kwargs, stop_after_steps=5, with_groups=with_groups)
    resumed_model, resumed = _train(tmp_path / "crash", kwargs, with_groups=with_groups)
    assert resumed.resumed_from_step == 5 and resumed.steps == full.steps
    full_state, resumed_state = full_model.state_dict(), resumed_model.state_dict()
    assert full_state.keys() == resumed_state.keys()
    for name in full_state:  # includes queue / queue_ptr / support / key encoder
        assert torch.allclose(full_state[name].float(), resumed_state[name].float(), atol=1e-5), name
    buffers = [n for n in full_state if n.startswith(("queue", "support"))]
    assert (case.startswith(("moco", "nnclr"))) == bool(buffers)


def test_default_method_config_builds_every_method():
    from contrastive.modalities.image.config import MethodConfig
    for name, cls in [("simclr", SimCLR), ("moco_v2", MoCoV2), ("nnclr", NNCLR)]:
        method = build_method(model_kwargs=MODEL, method_kwargs=MethodConfig(name=name).model_dump(mode="json"))
        assert isinstance(method, cls) and not method.wants_groups
    old = build_method(model_kwargs=MODEL, method_kwargs={"name": "simclr", "temperature": 0.2})  # older saved model
    assert isinstance(old, SimCLR) and old.hex_rule is None


def test_queue_larger_than_the_data_is_a_config_error():
    from contrastive.errors import ConfigError
    from pipeline_config.loader import config_from_dict
    from contrastive.modalities.image.config import check_feasible
    config = config_from_dict({"method": {"name": "moco_v2"}, "train": {"batch_size": 32}})
    with pytest.raises(ConfigError, match=r"--set method.moco.queue_size=112"):
        check_feasible(config, num_train=256)


def test_cache_key_settings_ignore_unused_sections():
    from contrastive.modalities.image.config import MethodConfig
    plain = MethodConfig()
    assert plain.in_use() == {"name": "simclr", "temperature": 0.2}  # keys of existing SimCLR runs unchanged
    control = MethodConfig(hex={"enabled": False, "q": {"value": 0.1}}, moco={"queue_size": 7})
    assert control.in_use() == plain.in_use()
    assert MethodConfig(hex={"enabled": True}).in_use() != plain.in_use()
    assert "nnclr" in MethodConfig(name="nnclr").in_use()
