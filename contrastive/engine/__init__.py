"""The one training engine every method and modality uses: loop, checkpoint, distributed, precision, optim."""
