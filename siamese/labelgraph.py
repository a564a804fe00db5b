"""What the labels say together: groups of "same" images, the pairs they imply, and contradictions.

Labels are edges of a graph over images. "Same" edges join images into groups (A=B, B=C ⇒ A=C); a
"different" edge between two groups makes every member of one different from every member of the other
(A=B, B≠C ⇒ A≠C). A "different" edge *inside* a group contradicts the "same" path that joins its two
images: one of those labels is wrong, and the path says which ones to review.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Edge:
    """One labeled pair, reduced to what the graph needs."""

    pair_id: str
    image_a: str
    image_b: str
    same: bool


@dataclass(frozen=True)
class ImpliedPair:
    """A pair the labels imply but do not state (same fields as ``train.LabeledPair``)."""

    pair_id: str
    image_a: str
    image_b: str
    same: bool


@dataclass(frozen=True)
class Contradiction:
    """A "different" label between two images that "same" labels put in one group.

    ``pair_ids`` holds the "different" pair first, then the "same" pairs of the path from its first image
    to its second; ``images`` is that path (first and last are the "different" pair's images).
    """

    pair_ids: tuple[str, ...]
    images: tuple[str, ...]
    explanation: str


def _edge(pair) -> Edge:
    """A store ``Pair`` (``label`` "same"/"different") or a ``LabeledPair`` (``same`` bool) as an Edge."""
    same = getattr(pair, "same", None)
    if same is None:
        label = getattr(pair, "label", None)
        if label not in ("same", "different"):
            raise ValueError(f"pair {getattr(pair, 'pair_id', '?')!r} has label {label!r}; expected same/different")
        same = label == "same"
    if pair.image_a == pair.image_b:
        raise ValueError(f"pair {pair.pair_id!r} joins an image to itself")
    return Edge(str(pair.pair_id), pair.image_a, pair.image_b, bool(same))


def _unrank_combination(index: int, n: int) -> tuple[int, int]:
    """The index-th pair (i < j) of range(n) in the order (0,1), (0,2), (1,2), (0,3), …"""
    j = int((math.isqrt(8 * index + 1) + 1) // 2)
    while j * (j - 1) // 2 > index:
        j -= 1
    while (j + 1) * j // 2 <= index:
        j += 1
    return index - j * (j - 1) // 2, j


def _short(digest: str) -> str:
    return digest[:8]


class LabelGraph:
    """Images and their labels as a graph; built once per question, cheap for 100,000 labels."""

    def __init__(self, edges: Iterable[Edge]):
        self.edges: list[Edge] = list(edges)
        self._parent: dict[str, str] = {}
        self._same_adjacent: dict[str, list[tuple[str, str]]] = {}  # image -> [(neighbour, pair_id)]
        self._counts: dict[bool, Counter[str]] = {True: Counter(), False: Counter()}  # same / different labels
        for edge in self.edges:
            self._find(edge.image_a), self._find(edge.image_b)
            self._counts[edge.same].update((edge.image_a, edge.image_b))
            if edge.same:
                self._union(edge.image_a, edge.image_b)
                self._same_adjacent.setdefault(edge.image_a, []).append((edge.image_b, edge.pair_id))
                self._same_adjacent.setdefault(edge.image_b, []).append((edge.image_a, edge.pair_id))
        self._members: dict[str, list[str]] = {}
        for image in sorted(self._parent):
            self._members.setdefault(self._find(image), []).append(image)

    @classmethod
    def from_pairs(cls, pairs: Iterable) -> LabelGraph:
        """From store ``Pair``s or ``train.LabeledPair``s (anything with pair_id, image_a, image_b and
        ``label`` or ``same``)."""
        return cls(_edge(p) for p in pairs)

    # -- union-find (deterministic roots: the smallest digest of a group)

    def _find(self, x: str) -> str:
        self._parent.setdefault(x, x)
        root = x
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[x] != root:  # path compression
            self._parent[x], x = root, self._parent[x]
        return root

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)

    # -- questions

    def images(self) -> list[str]:
        """Every labeled image, sorted."""
        return sorted(self._parent)

    def groups(self, min_size: int = 2) -> list[list[str]]:
        """Images joined by "same" labels, largest group first (ties by first digest); members sorted."""
        found = [members for members in self._members.values() if len(members) >= min_size]
        return sorted(found, key=lambda members: (-len(members), members[0]))

    def group_of(self, digest: str) -> str | None:
        """The group's id (its smallest digest), or None for an image without labels."""
        return self._find(digest) if digest in self._parent else None

    def usage(self) -> Counter[str]:
        """How many labeled pairs each image is in."""
        return self._counts[True] + self._counts[False]

    def labeled(self) -> set[frozenset[str]]:
        """The labeled pairs, as unordered pairs of digests."""
        return {frozenset((edge.image_a, edge.image_b)) for edge in self.edges}

    def hint(self, digest: str) -> str | None:
        """What the labels say about one image, in words; None when it has no labels."""
        if digest not in self._parent:
            return None
        same, different = self._counts[True][digest], self._counts[False][digest]
        text = f"labeled same as {same} image{'s' if same != 1 else ''}, different from {different}"
        implied = len(self._members[self._find(digest)]) - 1 - same
        if implied > 0:
            text += f"; in a group of {implied + same + 1} same images"
        return text

    def contradictions(self) -> list[Contradiction]:
        """Each "different" label inside a "same" group, with the shortest "same" path that contradicts it."""
        found = []
        for edge in self.edges:
            if edge.same or self._find(edge.image_a) != self._find(edge.image_b):
                continue
            images, pair_ids = self._same_path(edge.image_a, edge.image_b)
            chain = " = ".join(_short(d) for d in images)
            found.append(
                Contradiction(
                    pair_ids=(edge.pair_id, *pair_ids),
                    images=tuple(images),
                    explanation=(
                        f"{_short(edge.image_a)} and {_short(edge.image_b)} are labeled different, but the "
                        f"'same' labels {chain} make them the same; one of these {len(pair_ids) + 1} labels is wrong"
                    ),
                )
            )
        return found

    def _same_path(self, start: str, goal: str) -> tuple[list[str], list[str]]:
        """Breadth-first: the fewest "same" edges from ``start`` to ``goal`` (images, pair ids)."""
        came_from: dict[str, tuple[str, str] | None] = {start: None}
        queue = deque([start])
        while queue:
            image = queue.popleft()
            if image == goal:
                break
            for neighbour, pair_id in self._same_adjacent.get(image, ()):
                if neighbour not in came_from:
                    came_from[neighbour] = (image, pair_id)
                    queue.append(neighbour)
        images, pair_ids = [goal], []
        step = came_from[goal]
        while step is not None:
            previous, pair_id = step
            images.append(previous)
            pair_ids.append(pair_id)
            step = came_from[previous]
        return images[::-1], pair_ids[::-1]

    def implied(self, max_count: int | None = None, seed: int = 0) -> list[ImpliedPair]:
        """Pairs the labels imply but do not state; contradictory groups imply nothing.

        When there are more than ``max_count`` (default: 4 per labeled pair), a seeded uniform sample is
        returned, without ever listing them all (a group of 10,000 implies 50 million pairs).
        """
        if max_count is None:
            max_count = 4 * len(self.edges)
        members = self._members
        contradictory = {
            self._find(e.image_a) for e in self.edges if not e.same and self._find(e.image_a) == self._find(e.image_b)
        }
        # Blocks of candidate pairs: ("same", group) or ("different", group, group), each with its size.
        blocks: list[tuple[str, str, str | None, int]] = []
        for root in sorted(members):
            n = len(members[root])
            if root not in contradictory and n > 2:
                blocks.append(("same", root, None, n * (n - 1) // 2))
        different_groups = set()
        for e in self.edges:
            if not e.same:
                ra, rb = sorted((self._find(e.image_a), self._find(e.image_b)))
                if ra != rb and ra not in contradictory and rb not in contradictory:
                    different_groups.add((ra, rb))
        for ra, rb in sorted(different_groups):
            size = len(members[ra]) * len(members[rb])
            if size > 1:
                blocks.append(("different", ra, rb, size))
        total = sum(block[3] for block in blocks)
        labeled = self.labeled()
        indices: Sequence[int] | range
        if total <= max_count + len(labeled):
            indices = range(total)
        else:  # positions in the blocks' concatenation; the labeled ones among them are skipped below
            indices = sorted(random.Random(seed).sample(range(total), min(total, max_count + len(labeled))))
        result: list[ImpliedPair] = []
        block_iter = iter(blocks)
        kind, ra, rb, size = next(block_iter, ("", "", None, 0))
        offset = 0
        for index in indices:
            while index >= offset + size:
                offset += size
                kind, ra, rb, size = next(block_iter)
            local = index - offset
            if kind == "same":
                i, j = _unrank_combination(local, len(members[ra]))
                a, b = members[ra][i], members[ra][j]
            else:
                a, b = members[ra][local // len(members[rb])], members[rb][local % len(members[rb])]
            if frozenset((a, b)) in labeled:
                continue
            result.append(ImpliedPair(f"implied:{a[:16]}:{b[:16]}", a, b, kind == "same"))
        if len(result) > max_count:
            result = sorted(random.Random(seed + 1).sample(result, max_count), key=lambda p: (p.image_a, p.image_b))
        return result
