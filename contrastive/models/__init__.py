from contrastive.models.encoders import ContrastiveModel, ProjectionHead, SmallCNN, build_model, resnet18_cifar

__all__ = ["ContrastiveModel", "ProjectionHead", "SmallCNN", "build_model", "resnet18_cifar"]
