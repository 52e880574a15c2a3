"""The image modality's datasets, each turned once into the prepared on-disk format of
:mod:`contrastive.data.dataset` (read back by :class:`~contrastive.data.dataset.ImageArrayDataset`, or
:class:`~contrastive.data.image_files.ImageFileDataset` for a folder kept as files).

- ``trifeature`` / ``trifeature_paper`` / ``hierarchical``: synthetic scenes of colour, shape and texture.
- ``image_folder``: a user's own folder of images (labels from a CSV or class subfolders).
- ``cifar_mnist`` / ``celeba`` / ``stl10`` / ``imagenet``: the paper datasets, from the user's downloads
  (``sources``: finding and fingerprinting those files).
"""
