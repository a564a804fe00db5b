"""Configuration: frozen dataclasses for the model and training, and the app's settings.

Settings are read in one place (:func:`Settings.from_env`, :func:`parse_settings`): environment
variables first, then command-line flags, which win.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

RUNTIMES = ("onnx", "torch")  # how scoring runs the forward pass (siamese.runtime)
PRECISIONS = ("fp32", "int8")


@dataclass(frozen=True)
class ModelConfig:
    """What a :class:`~siamese.model.ContrastiveSiameseNetwork` is built from; saved with its weights."""

    backbone: str = "resnet18"  # a name from siamese.backbones.BACKBONES
    embedding_dim: int = 128  # size of the L2-normalized embedding
    head_depth: int = 2  # linear layers in the projection head (ReLU between them)
    head_hidden: int = 512  # width of the head's hidden layers when head_depth > 1
    pretrained: bool = True  # ask for ImageNet weights for torchvision backbones

    def __post_init__(self) -> None:
        if self.embedding_dim < 2:
            raise ValueError(f"embedding_dim must be at least 2, got {self.embedding_dim}")
        if self.head_depth < 1:
            raise ValueError(f"head_depth must be at least 1, got {self.head_depth}")
        if self.head_hidden < 1:
            raise ValueError(f"head_hidden must be at least 1, got {self.head_hidden}")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _env_flag(value: str | None, default: bool) -> bool:
    if value is None or value.strip() == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {value!r}")


def parse_auth(value: str | None) -> tuple[tuple[str, str], ...]:
    """Parses ``user:password[,user:password…]`` into pairs; raises ValueError on a malformed entry."""
    if not value:
        return ()
    pairs = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            continue
        user, sep, password = entry.partition(":")
        if not sep or not user or not password:
            raise ValueError(f"SIAMESE_AUTH entries must look like user:password, got {entry!r}")
        pairs.append((user, password))
    return tuple(pairs)


@dataclass(frozen=True)
class Settings:
    """The app's settings (see ../shared/API.md); every field has an environment variable."""

    data_dir: Path = Path("./data")  # SIAMESE_DATA_DIR: everything the app writes
    backbone: str = "resnet18"  # SIAMESE_BACKBONE
    pretrained: bool = True  # SIAMESE_PRETRAINED
    weights: Path | None = None  # SIAMESE_WEIGHTS: a safetensors checkpoint to start from
    auth: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # SIAMESE_AUTH
    hub_dataset: str | None = None  # SIAMESE_HUB_DATASET (needs HF_TOKEN)
    runtime: str = "onnx"  # SIAMESE_RUNTIME: "onnx" (ONNX Runtime on a CPU) or "torch", for scoring
    precision: str = "fp32"  # SIAMESE_PRECISION: "fp32", or "int8" once verified on validation pairs

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"SIAMESE_RUNTIME must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"SIAMESE_PRECISION must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        weights = env.get("SIAMESE_WEIGHTS") or None
        return cls(
            data_dir=Path(env.get("SIAMESE_DATA_DIR") or "./data"),
            backbone=env.get("SIAMESE_BACKBONE") or "resnet18",
            pretrained=_env_flag(env.get("SIAMESE_PRETRAINED"), True),
            weights=Path(weights) if weights else None,
            auth=parse_auth(env.get("SIAMESE_AUTH")),
            hub_dataset=env.get("SIAMESE_HUB_DATASET") or None,
            runtime=(env.get("SIAMESE_RUNTIME") or "onnx").strip().lower(),
            precision=(env.get("SIAMESE_PRECISION") or "fp32").strip().lower(),
        )


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per :class:`Settings` field; each defaults to its environment variable."""
    parser.add_argument("--data-dir", help="where the app writes everything (SIAMESE_DATA_DIR, ./data)")
    parser.add_argument("--backbone", help="backbone registry name (SIAMESE_BACKBONE, resnet18)")
    parser.add_argument(
        "--pretrained",
        choices=["0", "1"],
        help="load ImageNet weights for torchvision backbones (SIAMESE_PRETRAINED, 1)",
    )
    parser.add_argument("--weights", help="safetensors checkpoint to start from (SIAMESE_WEIGHTS)")
    parser.add_argument("--auth", help="user:password[,user:password...] (SIAMESE_AUTH)")
    parser.add_argument("--hub-dataset", help="HF dataset repo to push labels to (SIAMESE_HUB_DATASET)")
    parser.add_argument("--runtime", choices=RUNTIMES, help="scoring forward pass (SIAMESE_RUNTIME, onnx)")
    parser.add_argument(
        "--precision", choices=PRECISIONS, help="scoring precision; int8 only once verified (SIAMESE_PRECISION, fp32)"
    )


def settings_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    """Environment first, then the flags that were given."""
    settings = Settings.from_env(env)
    overrides: dict = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = Path(args.data_dir)
    if getattr(args, "backbone", None):
        overrides["backbone"] = args.backbone
    if getattr(args, "pretrained", None) is not None:
        overrides["pretrained"] = args.pretrained == "1"
    if getattr(args, "weights", None):
        overrides["weights"] = Path(args.weights)
    if getattr(args, "auth", None):
        overrides["auth"] = parse_auth(args.auth)
    if getattr(args, "hub_dataset", None):
        overrides["hub_dataset"] = args.hub_dataset
    for name in ("runtime", "precision"):
        if getattr(args, name, None):
            overrides[name] = getattr(args, name)
    return replace(settings, **overrides)


def parse_settings(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description="siamese: learn what similar means for your images")
    add_settings_arguments(parser)
    return settings_from_args(parser.parse_args(argv), env)
