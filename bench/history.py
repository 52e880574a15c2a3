"""Changes made to hot paths because a benchmark showed them slow, with the figures measured before and after.

The "before" figures come from the benchmark run just before the change (same machine, same load conditions as
far as a shared machine allows); the current figures are in the table of every new BENCHMARKS.md. Add an entry
here whenever a benchmark drives a change to library code.
"""

CHANGES = [
    {
        "title": "The CLIP reading process parses no tar and copies no batch (contrastive/modalities/image_text/"
                 "data.py `index_shard`, `SampleDecodePool.raw_samples` / `batches`), 2026-11-28",
        "where": "`stream_batches` and `iter_decoded` with decode workers: the thread that feeds training, which "
                 "shares the training thread's GIL",
        "why": "the clip row's 0.85x at 12 decoders on an H200; bench.clip_reader (1,536 samples in shards of 128, "
               "batch 128, 2-core machine at load 7-13) put our reading process at 0.20-0.24 ms of CPU a sample "
               "against open_clip_train's main process at 0.05-0.11. cProfile: the tar members read by webdataset "
               "and tarfile in that process (0.09 ms a sample alone, measured apart), and the samples of each "
               "worker's result stacked again into a batch (a 19 MB copy a batch of 128, the source pages faulted "
               "in from a fresh shared-memory mapping); the hand-overs themselves one message a batch.",
        "change": "one more worker process reads each shard's tar headers with webdataset's own grouping and "
                  "error handling (`index_shard`: a message a shard, a local uncompressed tar's members as "
                  "(offset, size); remote or compressed shards with their bytes); the reading thread shuffles and "
                  "chunks those references as before (the order depends only on the count); each decode worker "
                  "reads its samples with one pread each; a worker's result, the whole batch in its shared memory, "
                  "is the step's batch as it is, and a chunk after a skip is planned longer by the samples skipped "
                  "so the batches come back in step (the ones between are joined: one copy each).",
        "before": "bench.clip_reader --quick: ours 0.242 / 0.199 / 0.210 / 0.206 ms of the reading process's CPU a "
                  "sample at 1 / 4 / 8 / 12 workers, open_clip 0.093 / 0.052 / 0.060 / 0.105 (0.26x-0.51x)",
        "after": "bench.clip_reader, the same sizes (load 17): ours 0.028 / 0.032 / 0.029 / 0.030 ms a sample at "
                 "1 / 4 / 8 / 12 workers, open_clip 0.106 / 0.071 / 0.071 / 0.123 (2.22x-4.04x, flat in the number "
                 "of workers); the workers' CPU a sample (ours with the tar-header reader) 2.3-2.6 ms against "
                 "open_clip's 4.6-5.2",
        "behaviour": "the same batches (keys, pixels, tokens) and skip counts as before for 0 and N workers, "
                     "exports included (test_data.py: the pool against the thread, the index against "
                     "iter_raw_samples on a cut shard and a pipe: URL, the reading process with tarfile.open broken); "
                     "/dev/shm holds, besides the batches in flight, the ones the training side still holds (at "
                     "most prefetch + 4 segments a worker).",
    },
    {
        "title": "Workers reuse their results' shared memory (contrastive/data/workers.py `_ResultBuffers`, "
                 "`result_tensor`), 2026-11-26",
        "where": "`OrderedWorkers`, the one worker pool of the image-file / shard reader and the CLIP decode pool",
        "why": "profiling the image reader's workers (bench.image_input's JPEGs) counted 37 minor page faults an "
               "image in the worker: every batch went out in fresh shared memory, which the kernel faults in and "
               "zeroes page by page. A pool that only fills and hands over 64 x 3 x 224 x 224 uint8 batches cost "
               "0.22-0.26 ms of CPU an image that way against 0.03-0.04 ms writing into a reused segment.",
        "change": "each worker keeps a few shared segments (prefetch + 4) and writes its results into a free one; a "
                  "uint8 flag per segment in shared memory says it is lent out, and the reading process clears it once "
                  "no tensor it received in that segment is alive (a storage weak reference; at once when the pin "
                  "thread copied it), or at the next map for a result the DataLoader dropped. All lent out (a reader "
                  "that keeps its batches): a fresh segment, as before. Tests: the same segment (inode) comes back, "
                  "results a reader keeps are never overwritten, a map left part way gives its segments back.",
        "before": "paired A/B in one process (768 of the benchmark's JPEGs, 1 worker, 16 interleaved epochs a side, "
                  "the same reader with the segments switched off): 2.65 ms of CPU an image, 37.1 page faults an image "
                  "in the worker",
        "after": "2.38 ms an image (paired difference: median 0.22 ms, mean 0.19 ms), 0.14 page faults an image; "
                 "bench.image_input just after: 2.07x the baseline per core (the machine in a slow phase: the "
                 "baseline at 5.08 ms an image)",
        "behaviour": "the same batches (a result's every element is written; test_workers.py checks contents); the "
                     "worker's memory holds at most prefetch + 4 segments",
    },
    {
        "title": "A portrait JPEG's square resampled channels_last too (contrastive/modalities/image/datasets/image_folder.py "
                 "`_jpeg_square`), 2026-11-26",
        "where": "`load_square_rgb(decode_scale=\"auto\")`, the decoder of every image-file and shard reader",
        "why": "a profile of the workers' decode (bench.image_input's JPEGs, one process) found one `contiguous` "
               "call in three costing ~0.13 ms an image on average: the square was permuted then unsqueezed, so a "
               "portrait photo's (1, 3, n, n) view had a batch stride of 3; torch's resampling read it as "
               "channels-first and returned channels-first, and the (S, S, 3) result needed a transposing copy.",
        "change": "unsqueeze, then permute: both orientations reach the resampling channels_last and the result is "
                  "returned without a copy (test: the returned array shares memory with the resampling's output, "
                  "landscape and portrait).",
        "before": "`_jpeg_square` of 256 of the benchmark's 500 x 375 JPEGs, one thread, 3 interleaved passes: "
                  "1.84 / 1.62 / 1.64 ms an image (a slower phase later: 2.58 / 2.51 / 2.52); make bench 04:44: "
                  "ours 1.98 ms of CPU an image in the worker + reader, 1.75x the baseline per core",
        "after": "1.40 / 1.48 / 1.38 ms (slower phase: 2.13 / 2.13 / 1.96); make bench 08:48: ours 1.80 ms an image, "
                 "1.70x per core (the baseline itself ran 3.06 ms against 3.47; two bench.image_input runs between: "
                 "1.77x, 2.10x)",
        "behaviour": "the same pixels (max abs difference 0 on the 256 JPEGs)",
    },
    {
        "title": "CLIP decoding in worker processes instead of threads (contrastive/data/workers.py, "
                 "contrastive/modalities/image_text/data.py), 2026-11-26",
        "where": "`OrderedWorkers`, `SampleDecoder`, `SampleDecodePool`, `stream_batches(pool=)`, "
                 "`GroupedBatchReader.batches(pool=)`",
        "why": "make gpu-check's clip row on an H200 (16 cores), ViT-B-32 batch 128, bf16, ours decoding in N threads "
               "against open_clip_train in N worker processes: N = 4: 1,137 vs 1,470 samples/s (0.77x); N = 12: "
               "825 vs 2,001 (0.41x). Our threads read slower with more of them (GIL contention with the reading "
               "and training threads); open_clip's processes scaled.",
        "change": "the decoding (and tokenising) runs in DataLoader worker processes kept for the stage, handed "
                  "chunks of a batch / workers encoded samples by the reading thread, which keeps the tar reading "
                  "and the seeded shuffle (the order and the keyed augmentation stay the same for any number of "
                  "workers); the image reader's plan-as-sampler DataLoader became the one pool both readers use; "
                  "a CLIP pool's forkserver preloads open_clip (a pool's workers start in 0.3 s, not 2.5 s).",
        "before": "CPU (bench.image_input, 1 worker a side): 1.78x open_clip's samples per CPU-second "
                  "(2026-11-25); GPU: as above",
        "after": "CPU: 1.61x in make bench, 1.66x in a bench.image_input run before it (2026-11-26, a slower day); GPU: not measured "
                 "yet (next lease: make gpu-check ROWS=clip)",
        "behaviour": "the same batches, views and losses for 0 and 4 decode workers "
                     "(tests/unit/modalities/image_text/test_steps_decode_workers.py, test_keyed_transform.py, "
                     "test_data.py).",
    },
    {
        "title": "CLIP shards read to uint8 batches, tokenised off the training thread "
                 "(contrastive/modalities/image_text/), 2026-11-25",
        "where": "`KeyedTransform(uint8=True)`, `normalize_batch`, `ready_for_step`, `in_flight`, "
                 "`data.decode_workers`",
        "why": "bench.image_input's CLIP row (new, issue 25), 768 samples of 256 px to ViT-B-32 batches of 64, 1 "
               "decode worker a side: 1.21-1.25x open_clip's get_wds_dataset per CPU-second with float batches (goal "
               "1.5x). A profile of ours (cProfile, 1 thread): PIL's bicubic crop-resize 0.8 ms a sample, stacking 64 "
               "float images (38 MB) 0.45 ms a sample, the copies of ToTensor + Normalize (permute, contiguous, to, "
               "div, clone) 0.6 ms, the JPEG decode 0.4 ms. Tokenising ran in the training step; decode_workers "
               "defaulted to 0.",
        "change": "the keyed transform stops before ToTensor + Normalize: uint8 images are stacked (a quarter of the "
                  "bytes) and normalised per batch by `normalize_batch` (the same float operations, bit-identical), "
                  "on the GPU in the step or by the reading thread of a CPU stage; captions tokenised and the batch "
                  "pinned on the reading thread; decode threads from the cores, a batch's worth in flight.",
        "before": "1.21x / 1.22x / 1.25x samples per CPU-second (float batches)",
        "after": "1.93x (a uint8 batch for the GPU to normalise), 1.47x normalised on the host (a CPU stage)",
        "behaviour": "the same floats reach the model (tests/unit/modalities/image_text/test_keyed_transform.py, "
                     "test_steps_decode_threads.py: 0 and 4 decode threads train the same batches and losses).",
    },
    {
        "title": "Image files decoded at a reduced DCT scale, workers from the cores "
                 "(contrastive/modalities/image/datasets/image_folder.py, contrastive/data/loading.py), 2026-11-25",
        "where": "`load_square_rgb(decode_scale=)`, `BatchReader`, `default_workers`, "
                 "`IndexedImageDataset.decode_rows`",
        "why": "bench.image_input (new, issue 25): 1,024 JPEGs of 500 x 375 to 224 px batches, 1 worker a side: "
               "PIL's full-size decode and a bicubic resampling of the 375 px square made ours 0.83-0.95x "
               "torchvision ImageFolder + v2 RandomResizedCrop per CPU-second (row 'decode_scale=full'); PIL's "
               "draft mode never reduces such photos (only powers of two, and 375 / 2 < 224). Per image on this "
               "machine: PIL decode 1.3-1.5 ms, libjpeg-turbo at 5/8 0.9 ms, PIL bicubic 375 -> 224 1.2 ms, "
               "235 -> 224 0.7 ms. Workers defaulted to 0 and were started again every epoch.",
        "change": "data.image_folder.decode_scale=auto (default): simplejpeg decodes JPEGs at the smallest n/8 "
                  "scale keeping the shorter side >= image_size, the same square box scaled by n/8; a batch built "
                  "in a worker's shared memory with one transposing copy; train.workers unset = the cores rule; "
                  "one BatchReader per stage with persistent workers.",
        "before": "0.83x (decode_scale=full row of the first run, load 5.9) / 0.88x / 0.95x per CPU-second",
        "after": "1.11x / 1.19x / 1.20x / 1.10x per CPU-second in four runs (goal 2x: missed; libjpeg-turbo's decode "
                 "alone is ~0.9 ms of ours' ~2 ms an image, the baseline's whole pipeline ~2.3 ms). torch's "
                 "uint8 antialiased bicubic (0.2 ms against PIL's 0.7) was tried for the resampling and dropped: "
                 "called from the in-process decode threads it fights torch's intra-op pool (15 ms an image).",
        "behaviour": "pixels within a few levels of decode_scale=full (mean 1.6 / 255 on the bench photos), part of "
                     "the prepared dataset's key; identical batches and stage losses for 0, 1 and 3 workers "
                     "(tests/unit/data/test_loading.py, tests/unit/modalities/image/test_steps_workers.py).",
    },
    {
        "title": "DataLoader workers for image files and shards (contrastive/data/loading.py), 2026-11-23",
        "where": "`_iter_file_batches`, `_worker_context`",
        "why": "bench.engine_throughput, training from an image folder stored as files: 1.00x torchvision "
               "ImageFolder + v2 transforms in workers (goal 1.5x). Workers start from a forkserver (a fork of a "
               "process running a Prefect flow dies on start), and each epoch's new worker re-imported torch: the "
               "first batch came after 1.2-1.8 s of a 5-6 s epoch; after it, ours was already 1.36-1.52x.",
        "change": "`multiprocessing.set_forkserver_preload([torch, PIL.Image, contrastive.data.loading])` before the "
                  "first loader: the server imports them once, every later worker forks from it.",
        "before": "first batch 1.2-1.8 s; files path 1.00x (load 4.5), 1.07x (quiet)",
        "after": "first batch 0.06 s; files path 1.47x in the full make bench run of 2026-11-23 09:25 (goal 1.5x: "
                 "still 2 % short; the in-memory path is 1.53x, so the data path is now nearly free and what is "
                 "left is compute)",
        "behaviour": "identical batches (tests/unit/data/test_image_files.py, test_shards.py: workers=2 equals "
                     "workers=0).",
    },
    {
        "title": "Pseudo-label combination + int id lookup (contrastive/mcl/pseudo_labels.py, contrastive/mcl/ids.py), "
                 "2026-11-22",
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
                     "tests/unit/mcl/test_pseudo_labels.py, tests/unit/mcl/test_ids.py and "
                     "tests/unit/mcl/test_clustering.py pass.",
    },
    {
        "title": "k-means: opt-in training sample (contrastive/mcl/clustering.py), 2026-11-22",
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
                     "caller); tests/unit/mcl/test_clustering.py passes.",
    },
    {
        "title": "Int id lookup: one scatter instead of scatter + gather (contrastive/mcl/ids.py), 2026-11-22",
        "where": "`align_labels_to_ids` -> new `_scatter_int_labels` (non-negative 1-D integer labels, compact "
                 "int ids; anything else keeps the row join)",
        "why": "bench.pseudo_labels at M=12M: 1.30 s (goal < 1 s). Timing of the parts on the idle machine: "
               "combine 0.30-0.36 s, lookup 0.71-0.79 s, of which the random scatter `table[ids] = arange` 0.43 s "
               "and the random gather `labels[rows]` 0.23 s: two memory-latency-bound passes over a 12M "
               "permutation (torch index_put / index_select with 2 threads: no faster).",
        "change": "scatter the labels themselves by id into a -1-filled table (`by_id[ids] = labels`), then read "
                  "them in dataset order: one random pass. Duplicates: L ids filling fewer than L slots; missing: "
                  "a -1 read back. On either, the general path runs and words the error exactly as before.",
        "before": "12M, idle machine: 1.00-1.15 s (combine ~0.33 s, lookup ~0.73 s).",
        "after": "12M, same session: 0.75-0.91 s (combine ~0.33 s, lookup ~0.45 s).",
        "behaviour": "same outputs and error messages (tests: the scatter path against a dict lookup for 5 label "
                     "dtypes, duplicate/missing/out-of-range ids through it).",
    },
    {
        "title": "k-means: k-means++ seeding, Lloyd on a sample by default (contrastive/mcl/clustering.py, "
                 "pipeline_config/schema.py), 2026-11-22",
        "where": "`kmeans(..., init=)`, new `_initial_centroids`; `_check_finite`; config "
                 "`mcl.kmeans_init`, `mcl.kmeans_train_points_per_cluster` (default 1024)",
        "why": "the previous run's finding: speed needs a sample, quality needs better seeds. Idle-machine timing of "
               "the parts at 500k x 512, K=10 (MiniBatchKMeans 4.9-5.8 s): k-means++ on the whole 20k sample "
               "0.47 s; faiss Lloyd 25 its on 20k points 0.38 s; assigning all points 0.27 s; the finiteness check "
               "(float64 row sums) 0.21 s. Single k-means++ seedings, 5 seeds: inertia -1.2 % .. +0.4 % against "
               "MiniBatchKMeans with the same seed (median +0.04 %): seeds decide the local minimum.",
        "change": "best of 3 k-means++ seedings (sklearn `kmeans_plusplus` on 256 K points, each polished by 5 "
                  "Lloyd iterations there, lowest inertia on that sample wins), then 25 Lloyd iterations on a "
                  "seeded sample of 1024 K points, then every point assigned; the finiteness check is a BLAS "
                  "`x @ 1` (NaN/inf propagate) with an exact recheck of flagged rows (float32 overflow).",
        "before": "previous run: every point 0.72x (+0.94 % inertia, random seeds); opt-in 20k sample 5.3x (+0.5 %).",
        "after": "pipeline default, 3 seeds each, idle machine: 6.8x at -0.82 % median inertia (every seed lower); "
                 "every-point Lloyd with the new seeding 0.45x at -0.87 %.",
        "behaviour": "different (better) centroids for the same seed; `init=\"random\"` and "
                     "`kmeans_train_points_per_cluster=0` give the previous algorithm. Tests: k-means++ finds three "
                     "5-point far blobs in every seed where random seeding misses some; the sample trains on a "
                     "subset but assigns and scores every point; huge finite values are not reported as NaN.",
    },
    {
        "title": "k-means: chunked assignment after sampled training (contrastive/mcl/clustering.py), 2026-11-22",
        "where": "`kmeans`: `_training_rows`, `_unit_float32`, `_non_finite_rows`, `_non_finite_error`",
        "why": "with Lloyd on a sample, the only full pass left is the assignment, but `kmeans` still made an "
               "(M, D) float32 (and, spherical, normalised) copy of every embedding first: 30 GB for 10M x 768 "
               "CC12M embeddings, twice the float16 input.",
        "change": "the training sample is gathered and converted on its own; the assignment converts, checks "
                  "(NaN/inf) and searches 131,072 rows at a time. The NaN/inf check became a float32 row sum: "
                  "as a BLAS gemv between faiss searches, OpenBLAS's spinning threads took the 2 cores from faiss's "
                  "OpenMP threads (assignment pass +30 %, measured).",
        "before": "tracemalloc peak for 400k x 256 float16, spherical: the float32 copy alone is 391 MiB.",
        "after": "same input: peak 272 MiB in all (the float16 input is 195 MiB); at CC12M scale the peak is a "
                 "chunk (0.4 GB at D = 768) instead of 30 GB. Time at 500k x 512 (float32, not spherical): "
                 "0.72 s -> 0.84-0.88 s (the per-chunk check), still ~6x MiniBatchKMeans.",
        "behaviour": "same assignments, centroids and inertia; the NaN/inf error still counts all rows and names "
                     "the first (test with 64-row chunks and a NaN outside the training sample).",
    },
]

# What the benchmarks showed that is NOT changed here (a design decision, or outside a tiny fix), for the lead.
FINDINGS = [
    "For small K, faiss's exact search is faster on its SIMD path than on BLAS (sgemm with K=10 columns): 0.55 s "
    "against 1.46 s for 500k x 512 on the loaded machine of the previous run, identical assignments, by raising "
    "`faiss.cvar.distance_compute_blas_threshold` - a process-global setting, so left alone here (the assignment "
    "pass is now 0.27 s of the 0.78 s k-means on the idle machine).",
    "String-id lookup (`align_labels_to_ids` when the orders differ) takes the sort-merge join: numpy sorts and "
    "binary-searches '<U' strings, only ~1.4-2x faster than a Python dict (about 1.2-1.9 s at 1.2M ids, so ~12 s or "
    "more at 12M). pandas `Index.get_indexer` (hash join) was tried: no faster at 1.2M. The unimodal pipeline hits "
    "the same-order fast path; CLIP keys in another order would pay it. Option: translate keys to int64 once (the "
    "row index of a key table written with the shards) and join on those.",
    "k-means on a GPU (1M x 256, K=20000) is not measured: no GPU was lent to this project's sessions so far. "
    "At K > 256 the default seeding is faiss's random one (k-means++ would cost more than Lloyd).",
    'Per-step work of our unimodal loop on a zero-cost model (cProfile of one 32-step epoch of `train_stage`, 1 '
    "torch thread, 1 decode worker, 2026-11-27, machine loaded ~18 by other jobs; `bench.framework_overhead`'s "
    "model): of 9.0 s, the model's own forward and backward 4.6 s (autograd 3.2, batch norm 1.0, conv 0.4, the "
    "same work as a plain loop's), waiting for the next batch 1.6 s (one decode worker bounds a model this "
    "cheap), the loop's own Python (run_epochs, the loss's fp32 guard, Adam, the schedule, the distributed "
    'checks) ~0.5 s, and 1.2 s in the one `gc.collect()` of `release_device_memory` after the last step (outside '
    "the engine's clock, inside the whole call). That full collection ends every training stage, export and GPU "
    'k-means and scans every object of the process: 0.27 s of CPU where prefect, mlflow and tasks.steps are '
    'imported (446k objects), 0.00 s after `gc.freeze()`. The pipeline flow now collects and freezes its starting'
    ' heap once before its first step (`flows.pipeline.freeze_imported_heap`); a process that calls the steps '
    'itself (the `export` row of `make gpu-check`, 189k objects: ~0.1 s) still pays it, a suspect for part of the'
    " GPU export's whole-call gap.",
]
