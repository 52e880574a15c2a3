"""The image-text modality (``pipeline: clip``): multistage contrastive fine-tuning of open_clip models on
image-text webdataset shards.

Modules (import them directly; this package imports nothing heavy on its own):

- ``modality``: the plug-in of the one pipeline.       - ``config``: the pipeline config and its sections.
- ``model``: open_clip creation from one shared init (pretrained file / cached tag / seeded random init), block-count
  freezing, stage-model files.                       - ``loss``: symmetric InfoNCE, gathered with gradient under DDP.
- ``data``: shards as img2dataset writes them, tolerant decoding with counted skips, the tiny-shard writer.
- ``grouped``: cluster-pure batches over shards (per-stage re-shard by group + group-stream reader).
- ``adapter``: a batch -> CLIP's loss on the engine.  - ``steps``: train, export, re-shard, soup, encode, score.
- ``mmvp`` / ``evaluate``: MMVP pairs, retrieval R@k. - ``serving``: the registered model's image embeddings.

docs/clip.md describes the pipeline, the reader design and how to run it on CC12M.
"""
