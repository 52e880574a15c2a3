"""The image modality (``pipeline: image``): SimCLR-family methods on images, stage by stage.

- ``modality``: the plug-in of the one pipeline.   - ``config`` / ``dataset_config``: the pipeline config, datasets.
- ``augment``: two-view augmentation keyed by (seed, epoch, sample).  - ``adapter``: a batch -> a method's loss.
- ``steps``: train, export and evaluate a stage over directories.     - ``serving``: the registered model's input.
"""
