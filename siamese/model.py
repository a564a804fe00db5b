"""The contrastive Siamese network: one shared backbone and head, L2-normalized embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .backbones import Backbone, create_backbone
from .config import ModelConfig
from .images import Preprocessing


def _projection_head(in_dim: int, config: ModelConfig) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = in_dim
    for _ in range(config.head_depth - 1):
        layers += [nn.Linear(width, config.head_hidden), nn.ReLU(inplace=True)]
        width = config.head_hidden
    layers.append(nn.Linear(width, config.embedding_dim))
    return nn.Sequential(*layers)


class ContrastiveSiameseNetwork(nn.Module):
    """Both images of a pair pass through the same backbone and head (one set of modules).

    Embeddings are L2-normalized, so cosine similarity is a dot product and the Euclidean distance
    between two embeddings is ``sqrt(2 - 2 cos)``, in [0, 2].
    """

    def __init__(self, backbone: Backbone, config: ModelConfig):
        super().__init__()
        self.config = config
        self.backbone = backbone.module
        self.head = _projection_head(backbone.feature_dim, config)
        self.feature_dim = backbone.feature_dim
        self.preprocessing: Preprocessing = backbone.preprocessing
        self.pretrained = backbone.pretrained
        self.pretrained_note = backbone.note

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> (N, F) backbone features (what head mode caches)."""
        return self.backbone(images).flatten(1)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """(N, F) -> (N, D) unit-length embeddings."""
        return F.normalize(self.head(features), dim=1)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> (N, D) unit-length embeddings."""
        return self.project(self.features(images))

    def forward(self, images_a: torch.Tensor, images_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeds both sides in one batch through the shared modules; returns ((N, D), (N, D))."""
        if images_a.shape != images_b.shape:
            raise ValueError(f"both sides need the same shape, got {tuple(images_a.shape)} and {tuple(images_b.shape)}")
        embeddings = self.embed(torch.cat([images_a, images_b]))
        return embeddings[: len(images_a)], embeddings[len(images_a) :]

    @staticmethod
    def similarity(emb_a: torch.Tensor, emb_b: torch.Tensor) -> torch.Tensor:
        """Cosine similarity of unit vectors: (N, D), (N, D) -> (N,)."""
        return (emb_a * emb_b).sum(dim=-1)


def build_model(config: ModelConfig) -> ContrastiveSiameseNetwork:
    """The one factory: backbone from the registry (pretrained if asked and available) plus head."""
    return ContrastiveSiameseNetwork(create_backbone(config.backbone, config.pretrained), config)
