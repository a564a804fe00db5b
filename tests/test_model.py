"""The Siamese network: one shared tower, unit-length embeddings, built from a frozen config."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from siamese.backbones import create_backbone
from siamese.config import ModelConfig
from siamese.model import ContrastiveSiameseNetwork, build_model

SMALL = ModelConfig(backbone="small_cnn", pretrained=False, embedding_dim=16, head_hidden=32)


def batch(n: int = 3, seed: int = 0, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def model() -> ContrastiveSiameseNetwork:
    torch.manual_seed(0)
    return build_model(SMALL).eval()


def test_one_tower_serves_both_inputs(model):
    # A loss on the b side alone must put gradient into the same parameters that embed a.
    model.train()
    _, emb_b = model(batch(seed=1), batch(seed=2))
    emb_b.sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    assert grads["head.0.weight"].abs().sum() > 0
    assert next(g for n, g in grads.items() if n.startswith("backbone.")).abs().sum() > 0


def test_parameter_count_is_one_tower(model):
    backbone_params = sum(p.numel() for p in create_backbone("small_cnn", pretrained=False).module.parameters())
    f, h, d = 128, SMALL.head_hidden, SMALL.embedding_dim  # small_cnn features, head width, embedding
    head_params = (f * h + h) + (h * d + d)  # two Linear layers
    assert sum(p.numel() for p in model.parameters()) == backbone_params + head_params
    assert len({id(m) for m in model.modules() if isinstance(m, nn.Conv2d)}) == 6  # small_cnn's six, once


def test_forward_equals_embedding_each_side_in_eval_mode(model):
    a, b = batch(seed=3), batch(seed=4)
    with torch.no_grad():
        emb_a, emb_b = model(a, b)
        assert not torch.allclose(emb_a, emb_b, atol=1e-5)  # so a swap of the two sides would show
        assert torch.allclose(emb_a, model.embed(a), atol=1e-6)
        assert torch.allclose(emb_b, model.embed(b), atol=1e-6)
        assert torch.allclose(model.embed(a), model.project(model.features(a)))


def test_forward_refuses_mismatched_sides(model):
    with pytest.raises(ValueError, match="same shape"):
        model(batch(n=2), batch(n=3))


def test_embeddings_are_unit_length_and_similarity_is_the_dot_product(model):
    with torch.no_grad():
        emb_a, emb_b = model(batch(n=5, seed=5), batch(n=5, seed=6))
    assert emb_a.shape == (5, SMALL.embedding_dim)
    assert torch.allclose(emb_a.norm(dim=1), torch.ones(5), atol=1e-5)
    similarity = model.similarity(emb_a, emb_b)
    assert similarity.shape == (5,)
    assert torch.allclose(similarity, torch.nn.functional.cosine_similarity(emb_a, emb_b), atol=1e-5)
    for i in range(5):
        assert similarity[i].item() == pytest.approx(
            sum(x * y for x, y in zip(emb_a[i].tolist(), emb_b[i].tolist(), strict=True)), abs=1e-5
        )


def test_similarity_of_unit_vectors_gives_the_distance():
    # Random unit vectors (an untrained model's embeddings are all nearly parallel): D = √(2 − 2 cos).
    generator = torch.Generator().manual_seed(7)
    emb_a = torch.nn.functional.normalize(torch.randn(6, 8, generator=generator, dtype=torch.float64), dim=1)
    emb_b = torch.nn.functional.normalize(torch.randn(6, 8, generator=generator, dtype=torch.float64), dim=1)
    similarity = ContrastiveSiameseNetwork.similarity(emb_a, emb_b)
    assert torch.allclose((emb_a - emb_b).norm(dim=1), (2 - 2 * similarity).sqrt())
    assert torch.allclose(similarity, torch.nn.functional.cosine_similarity(emb_a, emb_b))


def test_model_keeps_its_config_and_backbone_facts(model):
    assert model.config is SMALL
    assert model.feature_dim == 128
    assert model.preprocessing.crop_size == 32
    assert model.pretrained is False


def test_default_config():
    config = ModelConfig()
    assert config.embedding_dim == 128
    assert config.backbone == "resnet18"
    assert config.pretrained is True


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMALL.embedding_dim = 64
    assert ModelConfig.from_dict(SMALL.to_dict()) == SMALL
    assert ModelConfig.from_dict({**SMALL.to_dict(), "from_a_newer_version": 1}) == SMALL


@pytest.mark.parametrize(("field", "value"), [("embedding_dim", 1), ("head_depth", 0), ("head_hidden", 0)])
def test_config_validates(field, value):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{field: value})


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_head_depth_sets_the_number_of_linear_layers(depth):
    config = dataclasses.replace(SMALL, head_depth=depth)
    model = build_model(config)
    linears = [m for m in model.head.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == depth
    assert linears[0].in_features == 128 and linears[-1].out_features == config.embedding_dim
    with torch.no_grad():
        assert model.eval().embed(batch(n=2)).shape == (2, config.embedding_dim)


def test_default_embedding_size_reaches_the_output():
    model = build_model(ModelConfig(backbone="small_cnn", pretrained=False)).eval()
    with torch.no_grad():
        assert model.embed(batch(n=2)).shape == (2, 128)
