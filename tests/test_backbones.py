"""The backbone registry: every backbone builds and embeds; ImageNet weights come from the cache or not at all."""

from __future__ import annotations

import contextlib
import logging
import pickle
import urllib.error
from pathlib import Path
from urllib.parse import urlparse

import pytest
import torch
import torchvision

from siamese import backbones
from siamese.backbones import BACKBONES, create_backbone, pick_device, weights_file_name
from siamese.config import ModelConfig
from siamese.images import Preprocessing
from siamese.model import build_model

TORCHVISION = ["resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0"]


@pytest.fixture
def offline(monkeypatch, tmp_path) -> Path:
    """An empty TORCH_HOME, and a network that fails at once (nothing here may download)."""

    def no_network(url, *args, **kwargs):
        raise urllib.error.URLError(f"no network in tests ({url})")

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_network)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    return tmp_path / "torch" / "hub" / "checkpoints"


@pytest.mark.parametrize("name", [*TORCHVISION, "small_cnn"])
def test_each_backbone_builds_and_embeds(name):
    model = build_model(ModelConfig(backbone=name, pretrained=False, embedding_dim=24)).eval()
    crop = model.preprocessing.crop_size
    with torch.no_grad():
        features = model.features(torch.randn(2, 3, crop, crop))
        embeddings = model.project(features)
    assert features.shape == (2, model.feature_dim)
    assert embeddings.shape == (2, 24)
    assert torch.allclose(embeddings.norm(dim=1), torch.ones(2), atol=1e-5)
    assert model.pretrained is False


def test_registry_has_the_documented_names():
    assert set(BACKBONES) >= {*TORCHVISION, "small_cnn"}


@pytest.mark.parametrize("name", TORCHVISION)
def test_preprocessing_comes_from_torchvision_weights(name):
    transforms = torchvision.models.get_model_weights(name).DEFAULT.transforms()
    expected = Preprocessing(
        resize_size=transforms.resize_size[0],
        crop_size=transforms.crop_size[0],
        mean=tuple(transforms.mean),
        std=tuple(transforms.std),
    )
    assert create_backbone(name, pretrained=False).preprocessing == expected


def test_small_cnn_preprocessing_and_no_pretrained_weights():
    backbone = create_backbone("small_cnn", pretrained=True)
    assert backbone.preprocessing.crop_size == 32
    assert backbone.pretrained is False
    assert "from scratch" in backbone.note
    assert weights_file_name("small_cnn") is None


def test_unknown_backbone_lists_the_known_names():
    with pytest.raises(ValueError, match="unknown backbone 'resnet9000'") as error:
        create_backbone("resnet9000", pretrained=False)
    for name in BACKBONES:
        assert name in str(error.value)
    with pytest.raises(ValueError, match="resnet9000"):
        build_model(ModelConfig(backbone="resnet9000"))


@pytest.mark.parametrize("name", TORCHVISION)
def test_weights_file_name_is_the_file_torch_hub_caches(name):
    url = torchvision.models.get_model_weights(name).DEFAULT.url
    assert weights_file_name(name) == Path(urlparse(url).path).name
    assert weights_file_name(name).endswith(".pth")


# --- ImageNet weights, without a network --------------------------------------------------------


def seeded_state_dict(name: str, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return torchvision.models.get_model(name, weights=None).state_dict()


def test_pretrained_weights_load_from_the_torch_home_cache(offline):
    offline.mkdir(parents=True)
    state = seeded_state_dict("resnet18", seed=1234)
    torch.save(state, offline / weights_file_name("resnet18"))

    model = build_model(ModelConfig(backbone="resnet18", pretrained=True))
    assert model.pretrained is True
    assert model.pretrained_note == ""
    loaded = model.backbone.state_dict()
    assert set(loaded) == {k for k in state if not k.startswith("fc.")}  # the classifier is gone
    for key, value in loaded.items():
        assert torch.equal(value, state[key]), key
    # The comparison could fail: a build without the cache has other weights.
    random = create_backbone("resnet18", pretrained=False).module.state_dict()
    assert not torch.equal(random["conv1.weight"], state["conv1.weight"])


def test_without_cache_or_network_random_weights_and_a_warning(offline, caplog):
    with caplog.at_level(logging.WARNING, logger=backbones.__name__):
        model = build_model(ModelConfig(backbone="mobilenet_v3_small", pretrained=True))
    assert model.pretrained is False
    assert "URLError" in model.pretrained_note and "no network" in model.pretrained_note
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "mobilenet_v3_small" in message and "random weights" in message
    assert weights_file_name("mobilenet_v3_small") in message  # tells the user which file to provide
    with torch.no_grad():
        assert model.eval().embed(torch.randn(1, 3, 224, 224)).shape == (1, 128)


def test_a_cache_file_for_another_model_falls_back_to_random_weights(offline):
    offline.mkdir(parents=True)
    torch.save(seeded_state_dict("mobilenet_v3_small", seed=1), offline / weights_file_name("resnet18"))
    backbone = create_backbone("resnet18", pretrained=True)
    assert backbone.pretrained is False
    assert "state_dict" in backbone.note or "Missing key" in backbone.note


class _Payload:
    """Unpickling this creates a file: what a malicious weights file would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("container", ["torch.save", "pickle"])
def test_a_malicious_pickle_in_the_cache_is_never_executed(offline, tmp_path, container):
    offline.mkdir(parents=True)
    marker = tmp_path / "pwned"
    cache_file = offline / weights_file_name("resnet18")
    payload = {"conv1.weight": _Payload(marker)}
    if container == "torch.save":
        torch.save(payload, cache_file)
    else:
        cache_file.write_bytes(pickle.dumps(payload, protocol=2))

    # The payload is live: an unsafe load runs it (a raw pickle runs it, then fails torch's format check).
    with contextlib.suppress(RuntimeError):
        torch.load(cache_file, weights_only=False)
    assert marker.exists()
    marker.unlink()

    backbone = create_backbone("resnet18", pretrained=True)
    assert not marker.exists()
    assert backbone.pretrained is False
    assert backbone.note


def test_pick_device(monkeypatch):
    assert pick_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device().type == "cuda"
