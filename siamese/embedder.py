"""Turning decoded images into embeddings, once each.

The cache is keyed by (model version, image content hash): an image seen before with the same model
costs a dictionary look-up, not a backbone forward. Within one call, identical images are embedded once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from .images import DecodedImage
from .model import ContrastiveSiameseNetwork


class EmbeddingCache:
    """A thread-safe LRU map from (model version, digest) to a (D,) embedding."""

    def __init__(self, max_items: int = 200_000):
        self.max_items = max_items
        self._items: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, version: str, digest: str) -> torch.Tensor | None:
        with self._lock:
            value = self._items.get((version, digest))
            if value is not None:
                self._items.move_to_end((version, digest))
            return value

    def put(self, version: str, digest: str, embedding: torch.Tensor) -> None:
        with self._lock:
            self._items[(version, digest)] = embedding
            self._items.move_to_end((version, digest))
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def items_for(self, version: str) -> dict[str, torch.Tensor]:
        """Every cached embedding of one model version, by digest."""
        with self._lock:
            return {digest: emb for (v, digest), emb in self._items.items() if v == version}

    def drop_version(self, version: str) -> None:
        with self._lock:
            for key in [key for key in self._items if key[0] == version]:
                del self._items[key]

    def __len__(self) -> int:
        return len(self._items)


class Embedder:
    """Embeds images with one model version: deduplicated, cached, batched, under inference_mode."""

    def __init__(
        self,
        model: ContrastiveSiameseNetwork,
        version: str,
        cache: EmbeddingCache | None = None,
        device: torch.device | str = "cpu",
        batch_size: int = 32,
    ):
        self.model = model.eval()
        self.version = version
        self.cache = cache if cache is not None else EmbeddingCache()
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.images_forwarded = 0  # how many images went through the backbone (tests and benchmarks read it)
        self.lock = threading.Lock()  # one forward at a time: two on 2 cores only thrash

    def _forward(self, images: Sequence[DecodedImage]) -> torch.Tensor:
        batch = self.model.preprocessing.to_tensor([item.image for item in images])
        batch = batch.to(self.device).contiguous(memory_format=torch.channels_last)
        with self.lock, torch.inference_mode():
            self.images_forwarded += len(images)
            return self.model.embed(batch).float().cpu()

    @torch.inference_mode()  # the result, and every cached row, is an inference tensor: no autograd, ever
    def embed(self, images: Sequence[DecodedImage]) -> torch.Tensor:
        """(N, D) unit-length embeddings, in the order given."""
        found: dict[str, torch.Tensor] = {}
        missing: dict[str, DecodedImage] = {}
        for item in images:
            if item.digest in found or item.digest in missing:
                continue
            cached = self.cache.get(self.version, item.digest)
            if cached is None:
                missing[item.digest] = item
            else:
                found[item.digest] = cached
        todo = list(missing.values())
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            for item, embedding in zip(chunk, self._forward(chunk), strict=True):
                embedding = embedding.clone()  # own storage, so the cache does not pin the batch
                self.cache.put(self.version, item.digest, embedding)
                found[item.digest] = embedding
        if not images:
            return torch.empty(0, self.model.config.embedding_dim)
        return torch.stack([found[item.digest] for item in images])
