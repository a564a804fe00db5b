"""Checkpoints: safetensors weights plus JSON metadata. Loading never unpickles anything.

A version directory holds ``model.safetensors`` and ``meta.json``. The metadata is also written into
the safetensors header, so a lone ``.safetensors`` file (``SIAMESE_WEIGHTS``, a download from the
Models tab) still knows its backbone, preprocessing and threshold.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model

from .config import ModelConfig
from .model import ContrastiveSiameseNetwork, build_model

WEIGHTS_FILE = "model.safetensors"
META_FILE = "meta.json"
FORMAT_VERSION = 1
_HEADER_KEY = "siamese"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message says why."""


def model_metadata(model: ContrastiveSiameseNetwork, **extra: Any) -> dict:
    """The metadata every checkpoint carries: config and preprocessing, plus ``extra`` (threshold, metrics…)."""
    meta = {
        "format_version": FORMAT_VERSION,
        "config": model.config.to_dict(),
        "preprocessing": model.preprocessing.to_dict(),
        "feature_dim": model.feature_dim,
        "embedding_dim": model.config.embedding_dim,
        "backbone": model.config.backbone,
        "pretrained_init": bool(model.pretrained),
    }
    meta.update(extra)
    return meta


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(model: ContrastiveSiameseNetwork, directory: Path, meta: dict) -> Path:
    """Writes ``directory/{model.safetensors, meta.json}`` atomically: all of it, or nothing.

    The files are written into a temporary sibling directory, flushed to disk, then renamed into place,
    so a crash or a full disk never leaves a half-written version behind.
    """
    directory = Path(directory)
    if directory.exists():
        raise FileExistsError(f"checkpoint directory {directory} already exists")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        text = json.dumps(meta, indent=2, sort_keys=True)
        weights = tmp / WEIGHTS_FILE
        save_model(model, str(weights), metadata={_HEADER_KEY: text})
        (tmp / META_FILE).write_text(text)
        for path in (weights, tmp / META_FILE):
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, directory)
        _fsync_dir(directory.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def read_metadata(path: Path) -> dict:
    """The metadata of a version directory or a ``.safetensors`` file."""
    path = Path(path)
    if path.is_dir():
        meta_file = path / META_FILE
        if meta_file.is_file():
            return json.loads(meta_file.read_text())
        path = path / WEIGHTS_FILE
    sibling = path.with_name(META_FILE)
    if sibling.is_file() and path.name == WEIGHTS_FILE:
        return json.loads(sibling.read_text())
    try:
        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
    except Exception as error:
        raise CheckpointError(f"{path.name} is not a readable safetensors file ({error})") from None
    if _HEADER_KEY not in header:
        raise CheckpointError(f"{path.name} has no siamese metadata; was it saved by siamese?")
    return json.loads(header[_HEADER_KEY])


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> tuple[ContrastiveSiameseNetwork, dict]:
    """Builds the model a checkpoint describes and loads its weights (strictly, without pickle).

    Args:
        path: a version directory or a ``.safetensors`` file.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    meta = read_metadata(path)
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    if weights.suffix != ".safetensors":
        raise CheckpointError(f"{weights.name}: only .safetensors weights are loaded (never pickles)")
    try:
        with safe_open(str(weights), framework="pt"):  # reads the header only: a pickle fails here, unopened
            pass
    except Exception as error:
        raise CheckpointError(f"{weights.name} is not a readable safetensors file ({error})") from None
    try:
        config = ModelConfig.from_dict({**meta["config"], "pretrained": False})  # weights come from the file
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{path.name}: invalid model config in metadata ({error})") from None
    model = build_model(config)
    try:
        load_model(model, str(weights), strict=True, device=str(device))
    except Exception as error:
        raise CheckpointError(f"{weights.name} does not fit a {config.backbone} model ({error})") from None
    model.pretrained = bool(meta.get("pretrained_init", False))
    model.pretrained_note = ""
    return model.to(device).eval(), meta
