"""Model versions on disk: every trained model, its lineage, and which one is active.

``<data_dir>/models/v<N>/`` holds one checkpoint (see :mod:`siamese.checkpoint`); ``ACTIVE`` names the
active one. Both are replaced atomically, so a crash leaves the previous state, never a partial one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from .checkpoint import META_FILE, load_checkpoint, save_checkpoint
from .model import ContrastiveSiameseNetwork

_NAME = re.compile(r"^v(\d{1,9})$")
_ACTIVE_FILE = "ACTIVE"


class VersionError(ValueError):
    """An unknown or malformed version name."""


@dataclass(frozen=True)
class VersionInfo:
    version: str
    created_at: str
    backbone: str
    metrics: dict
    parent: str | None
    threshold: float
    meta: dict

    def to_dict(self, active: str | None = None) -> dict:
        return {
            "version": self.version,
            "created_at": self.created_at,
            "backbone": self.backbone,
            "metrics": self.metrics,
            "parent": self.parent,
            "threshold": self.threshold,
            "active": self.version == active,
        }


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class ModelRegistry:
    """The versions under one directory."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob(".v*"):  # a save interrupted by a crash: never a version
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)

    def path(self, version: str) -> Path:
        """The directory of an existing version; VersionError for anything else (``../x`` included)."""
        if not isinstance(version, str) or not _NAME.match(version):
            raise VersionError(f"{version!r} is not a model version name (they look like v3)")
        path = self.root / version
        if not (path / META_FILE).is_file():
            known = ", ".join(info.version for info in self.versions()) or "none yet"
            raise VersionError(f"no model version {version!r}; known versions: {known}")
        return path

    def info(self, version: str) -> VersionInfo:
        meta = json.loads((self.path(version) / META_FILE).read_text())
        return VersionInfo(
            version=version,
            created_at=meta.get("created_at", ""),
            backbone=meta.get("backbone", ""),
            metrics=meta.get("metrics", {}),
            parent=meta.get("parent"),
            threshold=float(meta.get("threshold", 0.5)),
            meta=meta,
        )

    def versions(self) -> list[VersionInfo]:
        """All versions, oldest first."""
        names = [p.name for p in self.root.iterdir() if _NAME.match(p.name) and (p / META_FILE).is_file()]
        return [self.info(name) for name in sorted(names, key=lambda name: int(name[1:]))]

    def _next_number(self) -> int:
        numbers = [int(m.group(1)) for p in self.root.iterdir() if (m := _NAME.match(p.name))]
        return max(numbers, default=-1) + 1

    def save(self, model: ContrastiveSiameseNetwork, meta: dict) -> VersionInfo:
        """Writes a new version (the next free ``v<N>``); ``meta`` gains ``version`` and ``created_at``."""
        for _ in range(100):  # another process may take the same number: try the next
            version = f"v{self._next_number()}"
            full = {**meta, "version": version, "created_at": meta.get("created_at") or now_iso()}
            try:
                save_checkpoint(model, self.root / version, full)
            except Exception as error:  # OSError, or safetensors' own error on a full disk
                if (self.root / version).exists():
                    continue
                raise OSError(f"could not save model version {version}: {error}") from error
            return self.info(version)
        raise RuntimeError("could not find a free version name")

    def load(self, version: str, device: torch.device | str = "cpu") -> tuple[ContrastiveSiameseNetwork, dict]:
        return load_checkpoint(self.path(version), device=device)

    def active(self) -> str | None:
        """The active version, or None; a pointer to a missing version counts as none."""
        try:
            version = (self.root / _ACTIVE_FILE).read_text().strip()
            self.path(version)
            return version
        except (OSError, VersionError):
            return None

    def set_active(self, version: str) -> None:
        self.path(version)
        fd, tmp = tempfile.mkstemp(prefix=".active.", dir=self.root)
        with os.fdopen(fd, "w") as handle:
            handle.write(version)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.root / _ACTIVE_FILE)
