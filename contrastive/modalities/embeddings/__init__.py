"""The embeddings modality (``pipeline: embeddings``): MCL over precomputed feature vectors (docs/embeddings.md).

Everything specific to it is in this package: the dataset (``data``), the config (``config``), the engine adapter
(``adapter``), the stage steps (``steps``) and the plug-in (``modality``); the one pipeline does the rest.
"""
