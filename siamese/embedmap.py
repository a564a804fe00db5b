"""A 2-D map of the pool under one model: PCA of the embeddings, labeled images coloured by group.

The projection is deterministic (each principal axis points so that its largest loading is positive,
as scikit-learn's PCA does), so the same embeddings always give the same map. Two models' maps can be
shown side by side: :func:`align` rotates (and possibly reflects) the previous map onto the new one by
orthogonal Procrustes over the images both contain, so what moved is visible and an arbitrary rotation
between two PCAs is not mistaken for change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

UNLABELED = "unlabeled"
NO_GROUP = "labeled, no 'same'"  # images with labels, but only "different" ones
# Distinct colours for the largest groups (Tableau 10), then a grey for the rest.
_PALETTE = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (188, 189, 34),
    (23, 190, 207),
    (127, 127, 127),
]
_UNLABELED_COLOUR = (200, 200, 200)


def pca(embeddings: np.ndarray, dims: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Principal components by SVD of the centred rows.

    Returns:
        ``(points, components, explained)``: (N, dims) coordinates, (dims, D) unit axes (largest
        loading of each positive) and each axis's share of the variance.
    """
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"need an (N, D) array of embeddings with N ≥ 1, got shape {x.shape}")
    centred = x - x.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    components = vt[:dims]
    signs = np.sign(components[np.arange(len(components)), np.abs(components).argmax(axis=1)])
    components = components * np.where(signs == 0, 1.0, signs)[:, None]
    variance = singular**2
    explained = variance[:dims] / variance.sum() if variance.sum() > 0 else np.zeros(len(components))
    points = centred @ components.T
    if points.shape[1] < dims:  # fewer images or dimensions than asked: flat along the missing axes
        points = np.pad(points, ((0, 0), (0, dims - points.shape[1])))
    return points, components, explained


def procrustes(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The orthogonal (d, d) R minimizing ‖source·R − target‖ over rotations and reflections.

    Both are centred first; the caller applies ``(source − mean) @ R + target mean``.
    """
    a = np.asarray(source, dtype=np.float64)
    b = np.asarray(target, dtype=np.float64)
    u, _, vt = np.linalg.svd((a - a.mean(axis=0)).T @ (b - b.mean(axis=0)))
    return u @ vt


@dataclass(frozen=True)
class EmbeddingMap:
    """Coordinates of pool images under one model version, and the label group of each."""

    version: str
    digests: tuple[str, ...]
    points: np.ndarray  # (N, 2)
    groups: tuple[str, ...]  # "group 1" (largest) …, NO_GROUP or UNLABELED
    explained: tuple[float, float]  # each axis's share of the variance

    def columns(self) -> dict[str, list]:
        """``x``, ``y``, ``group``, ``digest`` as lists: ``pandas.DataFrame(map.columns())`` feeds
        ``gr.ScatterPlot(x="x", y="y", color="group")``."""
        return {
            "x": [float(v) for v in self.points[:, 0]],
            "y": [float(v) for v in self.points[:, 1]],
            "group": list(self.groups),
            "digest": list(self.digests),
        }

    def records(self) -> list[dict]:
        """One dict per image (x, y, group, digest)."""
        return [
            {"x": float(x), "y": float(y), "group": g, "digest": d}
            for (x, y), g, d in zip(self.points, self.groups, self.digests, strict=True)
        ]


def group_names(digests: Sequence[str], graph=None) -> tuple[str, ...]:
    """Each image's group name under a :class:`~siamese.labelgraph.LabelGraph` (largest group is "group 1")."""
    if graph is None:
        return tuple(UNLABELED for _ in digests)
    names = {}
    for rank, members in enumerate(graph.groups(), start=1):
        for digest in members:
            names[digest] = f"group {rank}"
    labeled = set(graph.images())
    return tuple(names.get(d, NO_GROUP if d in labeled else UNLABELED) for d in digests)


def sample_points(groups: Sequence[str], max_points: int | None, seed: int = 0) -> np.ndarray:
    """Indices (sorted) of at most ``max_points`` images: every labeled one, then a seeded sample of the
    unlabeled; when the labeled alone are too many, a seeded sample of them."""
    everything = np.arange(len(groups))
    if max_points is None or len(groups) <= max_points:
        return everything
    rng = np.random.default_rng(seed)
    labeled = np.array([g != UNLABELED for g in groups], dtype=bool)
    chosen = np.flatnonzero(labeled)
    if len(chosen) >= max_points:
        return np.sort(rng.choice(chosen, max_points, replace=False))
    rest = np.flatnonzero(~labeled)
    return np.sort(np.concatenate([chosen, rng.choice(rest, max_points - len(chosen), replace=False)]))


def build_map(
    version: str,
    digests: Sequence[str],
    embeddings,
    graph=None,
    max_points: int | None = None,
    seed: int = 0,
    *,
    groups: Sequence[str] | None = None,
) -> EmbeddingMap:
    """The 2-D map of ``digests`` with embeddings (N, D) (a numpy array or tensor), groups from ``graph``.

    Each map is in its own PCA axes; :func:`align` turns another model's map onto them.

    Args:
        max_points: keep at most this many images (:func:`sample_points`), so a picture of a
            100,000-image pool stays readable. The PCA uses all of them.
        groups: each image's group name (:func:`group_names`), instead of ``graph``.
    """
    x = embeddings.detach().cpu().numpy() if hasattr(embeddings, "detach") else np.asarray(embeddings)
    if len(x) != len(digests):
        raise ValueError(f"need one embedding per digest; got {len(x)} for {len(digests)}")
    points, _, explained = pca(x, 2)
    groups = tuple(groups) if groups is not None else group_names(digests, graph)
    if len(groups) != len(digests):
        raise ValueError(f"need one group name per digest; got {len(groups)} for {len(digests)}")
    keep = sample_points(groups, max_points, seed)
    return EmbeddingMap(
        version=version,
        digests=tuple(digests[i] for i in keep),
        points=points[keep],
        groups=tuple(groups[i] for i in keep),
        explained=(float(explained[0]), float(explained[1]) if len(explained) > 1 else 0.0),
    )


def align(previous: EmbeddingMap, current: EmbeddingMap) -> EmbeddingMap:
    """``previous`` rotated/reflected (orthogonal Procrustes over shared images) onto ``current``'s axes,
    and scaled to its spread, so the two can be compared side by side. Unchanged with < 3 shared images."""
    where = {d: i for i, d in enumerate(current.digests)}
    shared = [(i, where[d]) for i, d in enumerate(previous.digests) if d in where]
    if len(shared) < 3:
        return previous
    src = previous.points[[i for i, _ in shared]]
    dst = current.points[[j for _, j in shared]]
    rotation = procrustes(src, dst)
    scale = np.linalg.norm(dst - dst.mean(axis=0)) / max(np.linalg.norm(src - src.mean(axis=0)), 1e-12)
    points = (previous.points - src.mean(axis=0)) @ rotation * scale + dst.mean(axis=0)
    return EmbeddingMap(previous.version, previous.digests, points, previous.groups, previous.explained)


def _colour(group: str) -> tuple[int, int, int]:
    if group == UNLABELED:
        return _UNLABELED_COLOUR
    if group == NO_GROUP:
        return (90, 90, 90)
    rank = int(group.split()[-1]) - 1
    return _PALETTE[rank] if rank < len(_PALETTE) - 1 else _PALETTE[-1]


def render(
    maps: EmbeddingMap | Sequence[EmbeddingMap],
    size: int = 480,
    point: int = 3,
    titles: Sequence[str] | None = None,
) -> Image.Image:
    """A PNG-ready picture of one map, or several side by side on one scale, with a colour key below.

    Args:
        titles: one per map (default: each map's version and image count).
    """
    maps = [maps] if isinstance(maps, EmbeddingMap) else list(maps)
    if not maps:
        raise ValueError("nothing to draw: give at least one map")
    if titles is not None and len(titles) != len(maps):
        raise ValueError(f"need one title per map; got {len(titles)} for {len(maps)}")
    titles = titles or [f"{m.version}  ({len(m.digests)} images)" for m in maps]
    margin, title, line = 16, 22, 20
    key = _key_lines(_key_entries(maps), size * len(maps) - 2 * margin, ImageDraw.Draw(Image.new("RGB", (1, 1))))
    canvas = Image.new("RGB", (size * len(maps), size + title + line * len(key)), "white")
    draw = ImageDraw.Draw(canvas)
    drawn = [m.points for m in maps if len(m.digests)]
    # One scale for every panel: after align(), the same place means the same thing in each.
    low = np.min([p.min(axis=0) for p in drawn], axis=0) if drawn else np.zeros(2)
    span = np.maximum(np.max([p.max(axis=0) for p in drawn], axis=0) - low, 1e-9) if drawn else np.ones(2)
    for panel, (emb_map, text) in enumerate(zip(maps, titles, strict=True)):
        left = panel * size
        draw.text((left + margin, 4), text, fill="black")
        draw.rectangle([left + 2, title, left + size - 3, title + size - 3], outline=(220, 220, 220))
        if len(emb_map.digests) == 0:
            continue
        xy = (emb_map.points - low) / span * (size - 2 * margin) + margin
        xy[:, 1] = size - xy[:, 1]  # y grows upwards on a plot
        order = sorted(range(len(xy)), key=lambda i: emb_map.groups[i] != UNLABELED)  # labeled on top
        for i in order:
            x, y = left + xy[i, 0], title + xy[i, 1]
            r = point if emb_map.groups[i] != UNLABELED else max(1, point - 1)
            draw.ellipse([x - r, y - r, x + r, y + r], fill=_colour(emb_map.groups[i]))
    for row, entries in enumerate(key):
        y = title + size + 4 + row * line
        for x, name, colour in entries:
            draw.rectangle([margin + x, y + 3, margin + x + 8, y + 11], fill=colour)
            draw.text((margin + x + 12, y + 1), name, fill="black")
    return canvas


def _key_entries(maps: Sequence[EmbeddingMap]) -> list[tuple[str, tuple[int, int, int]]]:
    """One swatch per colour in use: the largest groups by rank, the rest, labeled only "different", unlabeled."""
    present = {g for m in maps for g in m.groups}
    ranks = sorted(int(g.split()[-1]) for g in present if g.startswith("group "))
    entries = [(f"group {r}", _colour(f"group {r}")) for r in ranks if r < len(_PALETTE)]
    if ranks and ranks[-1] >= len(_PALETTE):
        entries.append(("smaller groups", _PALETTE[-1]))
    return entries + [(name, _colour(name)) for name in (NO_GROUP, UNLABELED) if name in present]


def _key_lines(entries, width: int, draw: ImageDraw.ImageDraw) -> list[list[tuple[int, str, tuple[int, int, int]]]]:
    """The key's entries placed in lines no wider than ``width``: (x, name, colour) each."""
    lines: list[list[tuple[int, str, tuple[int, int, int]]]] = [[]]
    x = 0
    for name, colour in entries:
        step = 12 + int(draw.textlength(name)) + 14
        if lines[-1] and x + step > width:
            lines.append([])
            x = 0
        lines[-1].append((x, name, colour))
        x += step
    return lines
