"""The plain way, as tutorials write it: the reference that benchmarks/bench_serve.py times siamese against.

A torchvision resnet18 with its classifier replaced by a projection head, and nothing else: every call
decodes with PIL and runs torchvision's transforms (Resize(256), CenterCrop(224), ToTensor, Normalize),
each image of a pair gets its own batch-1 forward under ``torch.no_grad()``, nothing is cached, nothing
is batched. Training is the usual ``Dataset`` + ``DataLoader`` loop: each pair's two images are decoded,
transformed and forwarded (two forwards per batch) at every step, with Adam at a fixed rate.

:func:`from_siamese` copies a siamese model's weights in, so both compute the same function on the same
images and only the way of computing it differs.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

# ImageNet statistics, as tutorials paste them.
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TRANSFORM = transforms.Compose(
    [transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), transforms.Normalize(MEAN, STD)]
)


class TutorialSiamese(nn.Module):
    """resnet18 without its classifier, then Linear-ReLU-Linear, L2-normalized: (N, 3, 224, 224) -> (N, 128)."""

    def __init__(self, embedding_dim: int = 128, hidden: int = 512):
        super().__init__()
        self.backbone = torchvision.models.resnet18(weights=None)
        self.backbone.fc = nn.Identity()
        self.head = nn.Sequential(nn.Linear(512, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, embedding_dim))

    def forward_once(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(self.backbone(x)), dim=1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_once(a), self.forward_once(b)


def from_siamese(model) -> TutorialSiamese:
    """A TutorialSiamese holding the weights of a resnet18 siamese model (same backbone, same head)."""
    net = TutorialSiamese(model.config.embedding_dim, model.config.head_hidden)
    net.backbone.load_state_dict(model.backbone.state_dict())
    net.head.load_state_dict(model.head.state_dict())
    return net.eval()


def load(data: bytes) -> torch.Tensor:
    """(3, 224, 224): PIL decode, then the transforms."""
    return TRANSFORM(Image.open(io.BytesIO(data)).convert("RGB"))


def embed(net: TutorialSiamese, data: bytes) -> torch.Tensor:
    """One image, one batch-1 forward: (128,)."""
    net.eval()
    with torch.no_grad():
        return net.forward_once(load(data).unsqueeze(0))[0]


def score(net: TutorialSiamese, data_a: bytes, data_b: bytes) -> float:
    """Cosine similarity of two encoded images: two decodes, two transforms, two batch-1 forwards."""
    net.eval()
    with torch.no_grad():
        emb_a, emb_b = net(load(data_a).unsqueeze(0), load(data_b).unsqueeze(0))
    return float(F.cosine_similarity(emb_a, emb_b)[0])


class PairDataset(Dataset):
    """(image_a, image_b, label) with both images decoded and transformed on every access."""

    def __init__(self, pairs: Sequence[tuple[bytes, bytes, bool]]):
        self.pairs = list(pairs)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int):
        a, b, same = self.pairs[i]
        return load(a), load(b), torch.tensor(float(same))


def contrastive_loss(emb_a, emb_b, label, margin: float = 1.0) -> torch.Tensor:
    distance = F.pairwise_distance(emb_a, emb_b)
    return (label * distance.pow(2) + (1 - label) * F.relu(margin - distance).pow(2)).mean()


def train(net: TutorialSiamese, pairs, epochs: int = 1, batch_size: int = 16, lr: float = 1e-4) -> float:
    """Trains in place (every step: decode, transform and two forwards); returns pairs per second."""
    loader = DataLoader(PairDataset(pairs), batch_size=batch_size, shuffle=True, num_workers=0)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    started = time.perf_counter()
    for _ in range(epochs):
        for a, b, label in loader:
            emb_a, emb_b = net(a, b)
            loss = contrastive_loss(emb_a, emb_b, label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - started
    net.eval()
    return epochs * len(pairs) / seconds
