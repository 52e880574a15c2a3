from contrastive.models.encoders import (ENCODERS, RESNETS, STEMS, VIT_PRESETS, ContrastiveModel, ProjectionHead,
                                         SmallCNN, VitPreset, build_backbone, build_model, resnet, resnet18_cifar, vit,
                                         vit_preset)

__all__ = ["ENCODERS", "RESNETS", "STEMS", "VIT_PRESETS", "ContrastiveModel", "ProjectionHead", "SmallCNN",
           "VitPreset", "build_backbone", "build_model", "resnet", "resnet18_cifar", "vit", "vit_preset"]
