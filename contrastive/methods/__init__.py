"""Contrastive methods: each owns its trainable modules and any extra state (queues, momentum encoders) and
turns two augmented views into a loss. The training loop only sees this interface."""
from contrastive.methods.base import ContrastiveMethod
from contrastive.methods.moco import MoCoV2
from contrastive.methods.nnclr import NNCLR
from contrastive.methods.simclr import SimCLR
from contrastive.methods.factory import build_method

__all__ = ["ContrastiveMethod", "MoCoV2", "NNCLR", "SimCLR", "build_method"]
