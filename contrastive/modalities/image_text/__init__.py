"""CLIP MCL: multistage contrastive fine-tuning of open_clip models on image-text webdataset shards.

Modules (import them directly; this package imports nothing heavy on its own):

- ``model``: open_clip creation from one shared init (pretrained file / cached tag / seeded random init), block-count
  freezing, precision, stage-model files.            - ``loss``: symmetric InfoNCE, gathered with gradient under DDP.
- ``data``: shards as img2dataset writes them, tolerant decoding with counted skips, the tiny-shard writer.
- ``grouped``: cluster-pure batches over shards (per-stage re-shard by group + group-stream reader) and
  ``measure_reader_throughput``.                     - ``distributed`` / ``launch``: torchrun plumbing.
- ``train``: the stage training loop.                - ``mmvp`` / ``evaluate``: MMVP pairs, retrieval R@k, model soup.
- ``stages``: the steps of a stage over directories, called by ``tasks.clip_tasks``.

docs/clip.md describes the pipeline, the reader design and how to run it on CC12M.
"""
