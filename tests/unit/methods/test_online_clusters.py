"""HEX inside MCL: the current stage's online clusters split a cluster-pure batch, so H(i) is a strict,
non-empty subset of the negatives (with hierarchy = earlier_clusters it is all of them)."""
import numpy as np
import torch
import torch.nn.functional as F

from contrastive.methods.hex import HexRule, OnlineClusterSettings
from contrastive.methods.losses import two_view_negatives
from contrastive.methods.online_clusters import OnlineClusters
from contrastive.methods.simclr import SimCLR
from tests.unit.modalities.image.training import train_on_images


def minibatch_kmeans_reference(centroids, counts, x, min_rate):
    """One step of Sculley's mini-batch k-means on the sphere, sample by sample bookkeeping in a loop."""
    centroids, counts = centroids.clone(), counts.clone()
    x = F.normalize(x, dim=1)
    ids = [int(np.argmax([float(row @ c) for c in centroids])) for row in x]
    for k in range(len(centroids)):
        members = [x[n] for n in range(len(x)) if ids[n] == k]
        if not members:
            continue
        counts[k] += len(members)
        rate = max(len(members) / counts[k].item(), min_rate)
        mean = torch.stack(members).mean(0)
        centroids[k] = F.normalize(centroids[k] + rate * (mean - centroids[k]), dim=0)
    return centroids, counts, ids


def test_update_is_minibatch_spherical_kmeans():
    gen = torch.Generator().manual_seed(0)
    clusters = OnlineClusters(k=3, dim=4, min_rate=0.2)
    first = torch.randn(10, 4, generator=gen)
    clusters.update(first)
    # Seeding: row 0, then each time the row farthest (lowest best cosine) from the seeds so far.
    unit = F.normalize(first, dim=1)
    seeds = [0]
    for _ in range(2):
        seeds.append(int((unit @ unit[seeds].T).max(1).values.argmin()))
    assert int(clusters.filled) == 3
    for step in range(3):
        x = torch.randn(10, 4, generator=gen)
        expected_centroids, expected_counts, expected_ids = minibatch_kmeans_reference(
            clusters.centroids, clusters.counts, x, 0.2)
        ids = clusters.update(x)
        assert ids.tolist() == expected_ids
        assert torch.allclose(clusters.centroids, expected_centroids, atol=1e-6)
        assert torch.equal(clusters.counts, expected_counts)
    # the seeds themselves (before any move): a fresh codebook's centroids are those rows
    fresh = OnlineClusters(k=3, dim=4, min_rate=0.2)
    fresh._seed_empty(unit)
    assert torch.allclose(fresh.centroids, unit[seeds])


def sub_clustered_batch(batch=8, dim=6, seed=1):
    """Two sub-clusters along e0 and e1 (half the samples each), both views close to their sample."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.zeros(batch, dim)
    centres[: batch // 2, 0] = 1.0
    centres[batch // 2:, 1] = 1.0
    return (centres + 0.05 * torch.randn(batch, dim, generator=gen),
            centres + 0.05 * torch.randn(batch, dim, generator=gen))


def test_online_clusters_give_a_strict_non_empty_hierarchy_in_a_cluster_pure_batch():
    v1, v2 = sub_clustered_batch()
    groups = torch.zeros(8, dtype=torch.long)  # a cluster-pure batch: every sample has pseudo-label 0
    both = torch.cat([v1, v2])
    negatives = two_view_negatives(8)
    earlier = SimCLR(backbone=torch.nn.Identity(), head=torch.nn.Identity(), temperature=0.5,
                     hex_rule=HexRule(hierarchy="earlier_clusters"), dim=6)
    degenerate = earlier.hex_select(anchors=both, candidates=both, negatives=negatives, step=0,
                                    anchor_groups=groups.repeat(2), candidate_groups=groups.repeat(2))
    assert torch.equal(degenerate.hierarchy, negatives)  # the degenerate composition: H(i) = every negative

    online = SimCLR(backbone=torch.nn.Identity(), head=torch.nn.Identity(), temperature=0.5,
                    hex_rule=HexRule(hierarchy="online_clusters", online=OnlineClusterSettings(k=2)), dim=6)
    assert online.wants_groups
    selection = online.hex_select(anchors=both, candidates=both, negatives=negatives, step=0,
                                  anchor_groups=groups.repeat(2), candidate_groups=groups.repeat(2), learn=both)
    h = selection.hierarchy
    sizes, available = h.sum(1), negatives.sum(1)
    assert (sizes > 0).all() and (sizes < available).all() and not (h & ~negatives).any()
    # exactly the anchor's own sub-cluster (both views of the 3 other samples of it)
    sub = torch.cat([torch.arange(8) // 4, torch.arange(8) // 4])
    assert torch.equal(h, (sub[:, None] == sub[None, :]) & negatives)
    assert selection.from_groups and selection.epsilon is None

    loss, stats = online.training_loss(v1, v2, step=1, groups=groups)
    assert torch.isfinite(loss) and stats["hex/mean_hierarchy_size"] == 6.0


def test_online_clusters_nest_inside_the_earlier_groups():
    """With groups (MoCo's queue holds other groups): H(i) = same earlier group AND same online cluster."""
    rule = HexRule(hierarchy="online_clusters")
    cos = torch.zeros(2, 5)
    anchor_groups, candidate_groups = torch.tensor([0, 1]), torch.tensor([0, 0, 1, 1, -1])
    anchor_clusters, candidate_clusters = torch.tensor([3, 3]), torch.tensor([3, 4, 3, 3, 3])
    selection = rule.select(cosines=cos, negatives=torch.ones(2, 5, dtype=torch.bool), step=0, total_steps=None,
                            anchor_groups=anchor_groups, candidate_groups=candidate_groups,
                            anchor_clusters=anchor_clusters, candidate_clusters=candidate_clusters)
    assert selection.hierarchy.tolist() == [[True, False, False, False, False], [False, False, True, True, False]]
    alone = rule.select(cosines=cos, negatives=torch.ones(2, 5, dtype=torch.bool), step=0, total_steps=None,
                        anchor_clusters=anchor_clusters, candidate_clusters=candidate_clusters)
    assert alone.hierarchy.tolist() == [[True, False, True, True, True]] * 2 and not alone.from_groups


def test_codebook_is_checkpointed_and_resumes(tmp_path):
    images = torch.randint(0, 255, (32, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    groups = np.repeat(np.arange(2), 16)
    kwargs = {"name": "moco_v2", "temperature": 0.5, "moco": {"queue_size": 16, "momentum": 0.9},
              "hex": {"enabled": True, "hierarchy": "online_clusters", "online": {"k": 3}}}
    full_model, full = train_on_images(checkpoint_dir=tmp_path / "full", method_kwargs=kwargs, images=images,
                                       plan_groups=groups, hex_groups=groups)
    _, partial = train_on_images(checkpoint_dir=tmp_path / "crash", method_kwargs=kwargs, images=images,
                                 plan_groups=groups, hex_groups=groups, stop_after_steps=3)
    resumed_model, resumed = train_on_images(checkpoint_dir=tmp_path / "crash", method_kwargs=kwargs,
                                             images=images, plan_groups=groups, hex_groups=groups)
    assert resumed.resumed_from_step == 3 and int(full_model.hex_clusters.filled) == 3
    assert torch.allclose(full_model.hex_clusters.centroids, resumed_model.hex_clusters.centroids, atol=1e-5)
    assert torch.equal(full_model.hex_clusters.counts, resumed_model.hex_clusters.counts)
    assert full.history[-1]["hex/from_groups"] == 1.0 and np.isfinite(full.final_loss)
