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
from .runtime import Engine, torch_engine


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
    """Embeds images with one model version: deduplicated, cached, batched, under inference_mode.

    The forward pass is an :class:`~siamese.runtime.Engine` (PyTorch by default; ONNX Runtime once the
    service has built one), swapped with :meth:`use` while requests run. Each embedding is computed by one
    engine and cached under that engine's key, so fp32 and int8 embeddings never mix.
    """

    def __init__(
        self,
        model: ContrastiveSiameseNetwork,
        version: str,
        cache: EmbeddingCache | None = None,
        device: torch.device | str = "cpu",
        batch_size: int = 32,
        engine: Engine | None = None,
    ):
        self.model = model.eval()
        self.version = version
        self.cache = cache if cache is not None else EmbeddingCache()
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.images_forwarded = 0  # how many images went through the backbone (tests and benchmarks read it)
        self.lock = threading.Lock()  # one forward at a time: two on 2 cores only thrash
        self._engine = engine or torch_engine(self.model)

    @property
    def engine(self) -> Engine:
        return self._engine

    def use(self, engine: Engine) -> None:
        """Serves the next requests with ``engine`` (one assignment: a request in flight keeps its own)."""
        self._engine = engine

    @property
    def key(self) -> str:
        """The cache key of the current engine's embeddings: the version, plus the precision if not fp32."""
        return self.version + self._engine.tag

    def cached(self, digest: str) -> torch.Tensor | None:
        return self.cache.get(self.key, digest)

    def _forward(self, images: Sequence[DecodedImage], engine: Engine) -> torch.Tensor:
        batch = self.model.preprocessing.to_tensor([item.image for item in images]).to(self.device)
        with self.lock:
            self.images_forwarded += len(images)
            return engine.run(batch).float().cpu()

    @torch.inference_mode()  # the result, and every cached row, is an inference tensor: no autograd, ever
    def embed(self, images: Sequence[DecodedImage]) -> torch.Tensor:
        """(N, D) unit-length embeddings, in the order given."""
        engine = self._engine  # one engine, and one cache key, for the whole call
        key = self.version + engine.tag
        found: dict[str, torch.Tensor] = {}
        missing: dict[str, DecodedImage] = {}
        for item in images:
            if item.digest in found or item.digest in missing:
                continue
            cached = self.cache.get(key, item.digest)
            if cached is None:
                missing[item.digest] = item
            else:
                found[item.digest] = cached
        todo = list(missing.values())
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start : start + self.batch_size]
            for item, embedding in zip(chunk, self._forward(chunk, engine), strict=True):
                embedding = embedding.clone()  # own storage, so the cache does not pin the batch
                self.cache.put(key, item.digest, embedding)
                found[item.digest] = embedding
        if not images:
            return torch.empty(0, self.model.config.embedding_dim)
        return torch.stack([found[item.digest] for item in images])
