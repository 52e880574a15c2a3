"""Changes made to hot paths because a benchmark showed them slow, with the figures measured before and after.

The "before" figures come from the benchmark run just before the change (same machine, same load conditions as
far as a shared machine allows); the current figures are in the table of every new BENCHMARKS.md. Add an entry
here whenever a benchmark drives a change to library code.
"""

CHANGES = [
    {
        "title": "Pseudo-label combination + int id lookup (contrastive/sampling.py), 2026-11-22",
        "where": "`_join_int_ids`, `align_labels_to_ids`, `combine_pseudo_labels`, `_densify`",
        "why": "bench.pseudo_labels at M=12M (3 stages x K=10, int64 ids in another order): 3.12 s, goal < 1 s. "
               "cProfile/timing of the parts: the duplicate-id check was a 12M-element random-access `np.bincount` "
               "(~0.45-0.7 s); `align_labels_to_ids` copied both id arrays with `astype(int64)` even when they were "
               "int64 already; `_join_int_ids` made shifted copies of both id arrays when the shift was 0 and built "
               "a boolean mask + masked gather even when every id was in range; `combine_pseudo_labels` allocated "
               "`code * radix + digit` as two fresh arrays and re-scanned the result for min/max it already knew.",
        "change": "duplicates detected by counting the filled slots of the lookup table after the scatter (a "
                  "duplicated id fills its slot twice; the bincount now runs only to word the error); "
                  "`astype(..., copy=False)`; no shift when the offset is 0; a direct `table[query]` when min/max "
                  "show all ids in range; `combined = code * radix; combined += digit`; `_densify(bounds=...)` "
                  "skips the min/max passes when the caller knows the range.",
        "before": "12M: 3.12 s wall (combine 1.08 s, lookup 2.57 s measured separately), tracemalloc peak 927 MiB "
                  "(81 B/sample); 10x the Python-dict baseline (extrapolated).",
        "after": "12M, next run, similar load: 1.49 s wall, ~1.0 s CPU (combine 0.40 s, lookup 1.04 s), tracemalloc "
                 "peak 286 MiB (25 B/sample); 19x the baseline. Remaining cost is the random-access scatter/gather "
                 "of a 12M permutation (memory latency); a direct-addressed label table was tried and was no faster.",
        "behaviour": "identical outputs and errors (same messages, counts and examples); "
                     "tests/unit/test_sampling.py and tests/unit/test_clustering.py pass.",
    },
    {
        "title": "k-means: opt-in training sample (contrastive/clustering.py), 2026-11-22",
        "where": "`kmeans(..., max_train_points=None)`, new helper `_training_sample`",
        "why": "bench.kmeans, 500k x 512, K=10: faiss Lloyd on all points took ~28 s against ~20 s for "
               "MiniBatchKMeans (0.7x; goal >= 5x). faiss's verbose log: every iteration is one exact search of "
               "all 500k points (~1.4 s here, BLAS sgemm with only 10 columns), 17-25 iterations; MiniBatchKMeans "
               "touches each point about twice. No setting keeps 'train on every point' and gets 5x.",
        "change": "new keyword `max_train_points` (default None = the previous behaviour, every point): when set, "
                  "Lloyd runs on a seeded uniform sample of that many points and then every point is assigned "
                  "and counted in the inertia. Not wired into the pipeline config: whether to turn it on (and "
                  "at what size) is a product decision, see the k-means rows for the trade-off.",
        "before": "all points: see the row 'ours as the pipeline runs it' (measured in every run, side by side).",
        "after": "sample of 2048 K points: see the row 'max_train_points' (same run).",
        "behaviour": "default unchanged (same centroids, assignments and inertia as before for every existing "
                     "caller); tests/unit/test_clustering.py passes.",
    },
]

# What the benchmarks showed that is NOT changed here (a design decision, or outside a tiny fix), for the lead.
FINDINGS = [
    "k-means goal (>= 5x MiniBatchKMeans at equal or lower inertia) needs more than speed. (a) Speed: training on a "
    "sample (`max_train_points`, opt-in) gets ~4.5-5x; (b) quality: faiss starts from random points, MiniBatchKMeans "
    "from k-means++, and on this data faiss lands in a worse local minimum (+0.5 to +0.9 % inertia). Over 4 seeds "
    "during development, faiss on a 20k sample with random init ranged -1.1 % .. +1.7 % against MiniBatchKMeans; "
    "with k-means++ init on the sample (`sklearn.cluster.kmeans_plusplus`, passed as `init_centroids` to "
    "`faiss.Kmeans.train`) -1.1 % .. +0.5 %. Neither is 'equal or lower' every time: best-of-n inits (`nredo`) on "
    "the sample is the robust option. (c) For small K, faiss's exact search is faster on its SIMD path than on "
    "BLAS (sgemm with K=10 columns): 0.55 s against 1.46 s for 500k x 512, identical assignments, by raising "
    "`faiss.cvar.distance_compute_blas_threshold` - a process-global setting, so left alone here.",
    "String-id lookup (`align_labels_to_ids` when the orders differ) takes the sort-merge join: numpy sorts and "
    "binary-searches '<U' strings, only ~1.4-2x faster than a Python dict (about 1.2 s at 1.2M ids, so ~12 s or "
    "more at 12M). The unimodal pipeline hits the same-order fast path; CLIP keys in another order would pay it. "
    "Options: translate keys to int64 once (e.g. the row index of a key table) and join on those, or a hash join "
    "(pandas `Index.get_indexer`).",
    "Pseudo-labels at 12M: after the fixes the remaining ~1.1-1.3 s (on this loaded machine) is one random scatter "
    "and one random gather over a 12M permutation plus three O(M) passes per stage in the combination; a "
    "direct-addressed label table was tried and was no faster. Below 1 s likely needs an unloaded machine or "
    "avoiding the permuted lookup (keep exports in dataset order, so the same-order fast path applies).",
]
