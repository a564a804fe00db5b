"""The embedder: each image is embedded once per model version, cached, and never tracked by autograd."""

from __future__ import annotations

import pytest
import torch

from siamese.config import ModelConfig
from siamese.embedder import Embedder, EmbeddingCache
from siamese.images import DecodedImage, load_image
from siamese.model import ContrastiveSiameseNetwork, build_model
from tests import images_factory as factory

DIM = 16


@pytest.fixture
def model() -> ContrastiveSiameseNetwork:
    torch.manual_seed(0)
    return build_model(ModelConfig(backbone="small_cnn", pretrained=False, embedding_dim=DIM, head_hidden=32))


@pytest.fixture
def backbone_calls(model) -> list[int]:
    """The batch size of every backbone forward (a hook, independent of the embedder's own counter)."""
    calls: list[int] = []
    model.backbone.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    return calls


def image(seed: int) -> DecodedImage:
    return load_image(factory.noise((20, 16), seed=seed))


def fresh(model: ContrastiveSiameseNetwork, item: DecodedImage) -> torch.Tensor:
    """The embedding computed directly, without the embedder."""
    with torch.no_grad():
        return model.eval().embed(model.preprocessing.to_tensor([item.image]))[0]


def test_embeddings_equal_a_direct_computation(model):
    items = [image(s) for s in range(3)]
    out = Embedder(model, "v1").embed(items)
    assert out.shape == (3, DIM)
    for row, item in zip(out, items, strict=True):
        assert torch.allclose(row, fresh(model, item), atol=1e-6)
    assert not torch.allclose(out[0], out[1], atol=1e-6)  # distinct images, distinct rows


def test_an_image_seen_before_runs_no_forward(model, backbone_calls):
    embedder = Embedder(model, "v1")
    a, b = image(1), image(2)
    first = embedder.embed([a, b])
    assert embedder.images_forwarded == 2 and backbone_calls == [2]
    again = embedder.embed([b, a])
    assert embedder.images_forwarded == 2 and backbone_calls == [2]
    assert torch.equal(again, first.flip(0))  # the cached rows, in the order asked
    # Same content from another source: same digest, still cached.
    assert torch.equal(embedder.embed([load_image(a.data)]), first[:1])
    assert backbone_calls == [2]


def test_identical_images_in_one_batch_are_embedded_once(model, backbone_calls):
    embedder = Embedder(model, "v1")
    a, b = image(1), image(2)
    out = embedder.embed([a, b, a, load_image(a.data), b])
    assert embedder.images_forwarded == 2 and backbone_calls == [2]
    assert torch.equal(out[0], out[2]) and torch.equal(out[0], out[3]) and torch.equal(out[1], out[4])


def test_a_new_version_recomputes(model, backbone_calls):
    cache = EmbeddingCache()
    a = image(1)
    v1 = Embedder(model, "v1", cache)
    v1.embed([a])
    with torch.no_grad():
        model.head[-1].bias.add_(1.0)  # the next version's weights
    v2 = Embedder(model, "v2", cache)
    out = v2.embed([a])
    assert v2.images_forwarded == 1 and backbone_calls == [1, 1]
    assert torch.allclose(out[0], fresh(model, a), atol=1e-6)
    assert not torch.allclose(cache.get("v1", a.digest), out[0])
    assert len(cache) == 2


def test_lru_eviction_respects_max_items():
    cache = EmbeddingCache(max_items=2)
    cache.put("v", "a", torch.zeros(2))
    cache.put("v", "b", torch.ones(2))
    assert cache.get("v", "a") is not None  # a is now the most recently used
    cache.put("v", "c", torch.full((2,), 2.0))
    assert len(cache) == 2
    assert cache.get("v", "b") is None
    assert torch.equal(cache.get("v", "a"), torch.zeros(2)) and torch.equal(cache.get("v", "c"), torch.full((2,), 2.0))


def test_evicted_images_are_embedded_again(model, backbone_calls):
    embedder = Embedder(model, "v1", EmbeddingCache(max_items=2))
    a, b, c = image(1), image(2), image(3)
    for item in (a, b, c):
        embedder.embed([item])
    assert len(embedder.cache) == 2
    embedder.embed([c, b])
    assert embedder.images_forwarded == 3
    embedder.embed([a])
    assert embedder.images_forwarded == 4


def test_cache_items_by_version_and_drop():
    cache = EmbeddingCache()
    cache.put("v1", "a", torch.zeros(2))
    cache.put("v2", "a", torch.ones(2))
    cache.put("v2", "b", torch.ones(2))
    assert set(cache.items_for("v2")) == {"a", "b"}
    cache.drop_version("v2")
    assert len(cache) == 1 and cache.items_for("v2") == {}
    assert cache.get("v1", "a") is not None


def test_batches_are_split_by_batch_size(model, backbone_calls):
    embedder = Embedder(model, "v1", batch_size=2)
    out = embedder.embed([image(s) for s in range(5)])
    assert backbone_calls == [2, 2, 1]
    assert out.shape == (5, DIM)


def test_cached_rows_own_their_storage(model):
    embedder = Embedder(model, "v1")
    items = [image(s) for s in range(4)]
    embedder.embed(items)
    row = embedder.cache.get("v1", items[0].digest)
    assert row.shape == (DIM,)
    assert row.untyped_storage().nbytes() == DIM * row.element_size()  # not a view pinning the whole batch


def test_embeddings_are_computed_under_inference_mode(model):
    out = Embedder(model, "v1").embed([image(1), image(2)])
    assert out.requires_grad is False
    assert out.is_inference()
    assert all(p.requires_grad for p in model.parameters())  # the model itself stays trainable
    cached = Embedder(model, "v1", EmbeddingCache()).embed([image(1)])
    assert cached.is_inference()


def test_unit_length_and_empty_input(model):
    embedder = Embedder(model, "v1")
    out = embedder.embed([image(s) for s in range(3)])
    assert torch.allclose(out.norm(dim=1), torch.ones(3), atol=1e-5)
    empty = embedder.embed([])
    assert empty.shape == (0, DIM)
    assert embedder.images_forwarded == 3
