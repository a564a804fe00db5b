"""The backbone registry: torchvision networks (ImageNet weights optional) and a small CNN.

Each entry gives a feature extractor ``(N, 3, H, W) -> (N, F)``, its feature size ``F`` and the
:class:`~siamese.images.Preprocessing` its weights were trained with (read from torchvision's
weights metadata, so a checkpoint always knows how its inputs must look).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .images import Preprocessing

log = logging.getLogger(__name__)


@dataclass
class Backbone:
    """A built feature extractor and what is known about it."""

    module: nn.Module
    feature_dim: int
    preprocessing: Preprocessing
    pretrained: bool  # whether ImageNet weights were actually loaded
    note: str = ""  # why not, when pretrained weights were asked for and could not be had


def _small_cnn() -> tuple[nn.Module, int]:
    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

    module = nn.Sequential(
        *block(3, 32), *block(32, 32), nn.MaxPool2d(2),  # 32 -> 16
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),  # 16 -> 8
        *block(64, 128), *block(128, 128),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),  # (N, 128)
    )  # fmt: skip
    return module, 128


# 32×32, three channels (a grayscale image is replicated), values mapped to [-1, 1].
SMALL_CNN_PREPROCESSING = Preprocessing(resize_size=32, crop_size=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _strip_classifier(name: str, model: nn.Module) -> int:
    """Replaces the ImageNet classifier with Identity; returns the pooled feature size."""
    if name.startswith("resnet"):
        dim = model.fc.in_features
        model.fc = nn.Identity()
        return dim
    if name.startswith("mobilenet_v3"):
        dim = model.classifier[0].in_features
        model.classifier = nn.Identity()
        return dim
    if name.startswith("efficientnet"):
        dim = model.classifier[-1].in_features
        model.classifier = nn.Identity()
        return dim
    raise AssertionError(f"no classifier rule for {name}")


def _load_imagenet_weights(model: nn.Module, weights) -> str:
    """Loads ``weights`` into ``model`` from the TORCH_HOME cache or the network; '' or why not."""
    try:
        # weights_only: torchvision's .pth files are pickles; only tensors may come out of them.
        state = weights.get_state_dict(progress=False, weights_only=True)
        model.load_state_dict(state)
        return ""
    except Exception as error:  # no network, a corrupt cache file, a mismatched state dict…
        return f"{type(error).__name__}: {error}"


def _torchvision(name: str) -> Callable[[bool], Backbone]:
    def build(pretrained: bool) -> Backbone:
        import torchvision

        weights = torchvision.models.get_model_weights(name).DEFAULT
        transforms = weights.transforms()
        preprocessing = Preprocessing(
            resize_size=int(transforms.resize_size[0]),
            crop_size=int(transforms.crop_size[0]),
            mean=tuple(float(x) for x in transforms.mean),
            std=tuple(float(x) for x in transforms.std),
        )
        model = torchvision.models.get_model(name, weights=None)
        note = ""
        if pretrained:
            note = _load_imagenet_weights(model, weights)
            if note:
                log.warning(
                    "ImageNet weights for %s could not be loaded (%s); starting from random weights. "
                    "Put %s in $TORCH_HOME/hub/checkpoints/ or allow network access.",
                    name, note, weights.url.rsplit("/", 1)[-1],
                )  # fmt: skip
        dim = _strip_classifier(name, model)
        return Backbone(model, dim, preprocessing, pretrained=pretrained and not note, note=note)

    return build


def _build_small_cnn(pretrained: bool) -> Backbone:
    module, dim = _small_cnn()
    note = "small_cnn has no pretrained weights; it trains from scratch" if pretrained else ""
    return Backbone(module, dim, SMALL_CNN_PREPROCESSING, pretrained=False, note=note)


BACKBONES: dict[str, Callable[[bool], Backbone]] = {
    "resnet18": _torchvision("resnet18"),
    "resnet50": _torchvision("resnet50"),
    "mobilenet_v3_small": _torchvision("mobilenet_v3_small"),
    "efficientnet_b0": _torchvision("efficientnet_b0"),
    "small_cnn": _build_small_cnn,
}


def create_backbone(name: str, pretrained: bool) -> Backbone:
    """Builds a registered backbone; unknown names get the list of known ones."""
    try:
        build = BACKBONES[name]
    except KeyError:
        raise ValueError(f"unknown backbone {name!r}; choose one of: {', '.join(BACKBONES)}") from None
    return build(pretrained)


def weights_file_name(name: str) -> str | None:
    """The file torchvision caches ``name``'s ImageNet weights under, or None for small_cnn."""
    if name == "small_cnn":
        return None
    import torchvision

    return torchvision.models.get_model_weights(name).DEFAULT.url.rsplit("/", 1)[-1]


def pick_device() -> torch.device:
    """CUDA when present, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
