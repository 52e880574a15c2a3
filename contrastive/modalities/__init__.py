"""Modality adapters of the engine: how a sample is read, batched and turned into a method's forward inputs."""
