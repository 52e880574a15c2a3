"""MCL pseudo-labels: ``combine_pseudo_labels`` turns the k-means cluster ids of ALL earlier stages
(y0, ..., y_{j-1}) into one dense int64 code per sample: the group from which stage j draws each batch. Inside
such a group the features earlier stages already learnt cannot separate positives from negatives, so the
encoder is pushed towards features that are still unlearnt.
"""
from __future__ import annotations

import numpy as np

from contrastive.errors import ConfigError
from contrastive.mcl.codes import _as_int_codes, _densify, _owned

__all__ = ["combine_pseudo_labels"]


def combine_pseudo_labels(*, stage_assignments: list[np.ndarray]) -> np.ndarray:
    """Combine the cluster ids of ALL earlier stages into one pseudo-label per sample.

    MCL, Section 3 / Algorithm 1: the pseudo-label of sample i for stage j is the tuple
    (y0[i], ..., y_{j-1}[i]). (The public reference code used only y_{j-1}: a loop-variable bug.)

    stage_assignments: list of int arrays, each (M,), aligned on the same sample order.
    Returns int64 (M,) in [0, G): equal codes iff equal tuples; codes are numbered in lexicographic
    order of the tuples (stage 0 most significant). Mixed-radix encoding, relabelled densely after
    every stage so the int64 code never overflows.
    """
    if not stage_assignments:
        raise ConfigError(
            "combine_pseudo_labels got no stages; pass the cluster assignments of every earlier stage."
        )
    arrays = [_as_int_codes(a, name=f"stage_assignments[{i}]") for i, a in enumerate(stage_assignments)]
    lengths = {a.size for a in arrays}
    if len(lengths) != 1:
        raise ConfigError(
            f"stage assignments have different lengths {[a.size for a in arrays]}; align every stage's "
            "assignments to the same sample ids (align_labels_to_ids) before combining."
        )
    code, num_codes = _densify(arrays[0])
    for stage in arrays[1:]:
        digit, radix = _densify(stage)
        # code < num_codes <= M and digit < radix <= M, so code * radix + digit < M^2 fits in int64.
        combined = code * radix  # a new array: code may be the caller's input
        combined += digit
        code, num_codes = _densify(combined, bounds=(0, num_codes * radix - 1))
    return _owned(code, stage_assignments[0])
