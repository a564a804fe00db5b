"""What the labels say together: groups of "same" images, the pairs they imply, and contradictions.

Labels are edges of a graph over images. "Same" edges join images into groups (A=B, B=C ⇒ A=C); a
"different" edge between two groups makes every member of one different from every member of the other
(A=B, B≠C ⇒ A≠C). A "different" edge *inside* a group contradicts the "same" path that joins its two
images: one of those labels is wrong, and the path says which ones to review.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType


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


def _as_edge(pair) -> Edge:
    edge = pair if type(pair) is Edge else _edge(pair)
    if edge.image_a == edge.image_b:
        raise ValueError(f"pair {edge.pair_id!r} joins an image to itself")
    return edge


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


def _decrement(counts: dict, key) -> None:
    """One less of ``key``; a count that reaches zero is removed (so views never show zeros)."""
    if counts[key] == 1:
        del counts[key]
    else:
        counts[key] -= 1


def _discard(adjacent: dict[str, dict[str, str]], image: str, pair_id: str) -> None:
    edges = adjacent[image]
    del edges[pair_id]
    if not edges:
        del adjacent[image]


class LabelGraph:
    """Images and their labels as a graph, kept up to date label by label.

    Adding a label costs about O(1) (union-find); removing one re-derives only the group it was in (a
    breadth-first walk of that group's "same" labels). So one graph can follow a store of 100,000 labels
    (see ``ModelService``) instead of being rebuilt for every question. Every answer depends only on the
    current set of labels, never on the order they came in: a graph changed label by label equals one
    built from the same labels at once. Not thread-safe: callers that share one hold a lock.
    """

    def __init__(self, edges: Iterable[Edge] = ()):
        self._edges: dict[str, Edge] = {}  # pair_id -> edge
        self._parent: dict[str, str] = {}  # union-find; every labeled image is a key
        self._members: dict[str, set[str]] = {}  # root -> the images of its group
        self._same_adjacent: dict[str, dict[str, str]] = {}  # image -> {pair_id: neighbour}, "same" labels
        self._different_adjacent: dict[str, dict[str, str]] = {}  # the same for "different" labels
        self._counts: dict[bool, dict[str, int]] = {True: {}, False: {}}  # image -> same / different labels
        self._usage: dict[str, int] = {}  # image -> labeled pairs it is in (no zeros)
        self._labeled: dict[frozenset[str], int] = {}  # unordered pair -> edges joining it
        self._contradicting: set[str] = set()  # ids of "different" labels inside one group
        for edge in edges:
            self.add(edge)

    @classmethod
    def from_pairs(cls, pairs: Iterable) -> LabelGraph:
        """From store ``Pair``s or ``train.LabeledPair``s (anything with pair_id, image_a, image_b and
        ``label`` or ``same``)."""
        return cls(_edge(p) for p in pairs)

    def copy(self) -> LabelGraph:
        """An independent graph with the same labels."""
        return LabelGraph(self._edges.values())

    def __len__(self) -> int:
        return len(self._edges)

    @property
    def edges(self) -> list[Edge]:
        """Every label, in the order added."""
        return list(self._edges.values())

    # -- changes

    def add(self, pair) -> None:
        """Adds one label (an :class:`Edge`, a store ``Pair`` or a ``LabeledPair``); one with the same
        ``pair_id`` is replaced."""
        edge = _as_edge(pair)
        old = self._edges.get(edge.pair_id)
        if old == edge:
            return
        if old is not None:
            self.remove(edge.pair_id)
        self._edges[edge.pair_id] = edge
        a, b = edge.image_a, edge.image_b
        usage, counts = self._usage, self._counts[edge.same]
        for image in (a, b):
            if image not in self._parent:
                self._parent[image] = image
                self._members[image] = {image}
            usage[image] = usage.get(image, 0) + 1
            counts[image] = counts.get(image, 0) + 1
        key = frozenset((a, b))
        self._labeled[key] = self._labeled.get(key, 0) + 1
        adjacent = self._same_adjacent if edge.same else self._different_adjacent
        adjacent.setdefault(a, {})[edge.pair_id] = b
        adjacent.setdefault(b, {})[edge.pair_id] = a
        if edge.same:
            self._union(a, b)
        elif self._find(a) == self._find(b):
            self._contradicting.add(edge.pair_id)

    def remove(self, pair_id: str) -> bool:
        """Takes one label out; False when there was none with that id."""
        edge = self._edges.pop(pair_id, None)
        if edge is None:
            return False
        a, b = edge.image_a, edge.image_b
        key = frozenset((a, b))
        _decrement(self._labeled, key)
        for image in (a, b):
            _decrement(self._usage, image)
            _decrement(self._counts[edge.same], image)
        adjacent = self._same_adjacent if edge.same else self._different_adjacent
        for image in (a, b):
            _discard(adjacent, image, pair_id)
        if edge.same:
            self._split(a, b)
        else:
            self._contradicting.discard(pair_id)
        for image in (a, b):
            if image not in self._usage:  # no labels left: an unlabeled image, alone in its group
                del self._parent[image], self._members[image]
        return True

    # -- union-find (deterministic roots: the smallest digest of a group)

    def _find(self, x: str) -> str:
        root = x
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[x] != root:  # path compression
            self._parent[x], x = root, self._parent[x]
        return root

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra == rb:
            return
        small, big = sorted((self._members[ra], self._members[rb]), key=len)
        for image in small:  # "different" labels between the two groups now lie inside one
            for pair_id, neighbour in self._different_adjacent.get(image, {}).items():
                if neighbour in big:
                    self._contradicting.add(pair_id)
        root, other = min(ra, rb), max(ra, rb)
        self._parent[other] = root
        big |= small
        del self._members[other]
        self._members[root] = big

    def _split(self, a: str, b: str) -> None:
        """After a "same" label a–b is gone: its group stays whole, or splits in two."""
        side_a = self._reachable(a)
        if b in side_a:
            return
        side_b = self._members.pop(self._find(a)) - side_a
        for side in (side_a, side_b):
            root = min(side)
            for image in side:
                self._parent[image] = root
            self._members[root] = side
        for image in min(side_a, side_b, key=len):  # labels between the parts no longer contradict
            for pair_id, neighbour in self._different_adjacent.get(image, {}).items():
                if self._parent[neighbour] != self._parent[image]:
                    self._contradicting.discard(pair_id)

    def _reachable(self, start: str) -> set[str]:
        seen, queue = {start}, deque([start])
        while queue:
            for neighbour in self._same_adjacent.get(queue.popleft(), {}).values():
                if neighbour not in seen:
                    seen.add(neighbour)
                    queue.append(neighbour)
        return seen

    # -- questions

    def images(self) -> list[str]:
        """Every labeled image, sorted."""
        return sorted(self._parent)

    def groups(self, min_size: int = 2) -> list[list[str]]:
        """Images joined by "same" labels, largest group first (ties by first digest); members sorted."""
        found = [sorted(members) for members in self._members.values() if len(members) >= min_size]
        return sorted(found, key=lambda members: (-len(members), members[0]))

    def group_of(self, digest: str) -> str | None:
        """The group's id (its smallest digest), or None for an image without labels."""
        return self._find(digest) if digest in self._parent else None

    def group_members(self) -> Mapping[str, AbstractSet[str]]:
        """Every labeled image's group, by group id: a read-only view that follows the graph (an image with
        only "different" labels is a group of one). Do not change the sets."""
        return MappingProxyType(self._members)

    def relation(self, image_a: str, image_b: str) -> bool | None:
        """What the labels say about two images, stated or implied: True (one "same" group), False (a
        "different" label between their groups) or None (nothing)."""
        if image_a not in self._parent or image_b not in self._parent:
            return None
        root_a, root_b = self._find(image_a), self._find(image_b)
        if root_a == root_b:
            return True
        small, other = (
            (root_a, root_b) if len(self._members[root_a]) <= len(self._members[root_b]) else (root_b, root_a)
        )
        for image in self._members[small]:
            for neighbour in self._different_adjacent.get(image, {}).values():
                if self._find(neighbour) == other:
                    return False
        return None

    def usage(self) -> Mapping[str, int]:
        """How many labeled pairs each image is in: a read-only view that follows the graph (copy it to
        keep it)."""
        return MappingProxyType(self._usage)

    def labeled(self) -> AbstractSet[frozenset[str]]:
        """The labeled pairs, as unordered pairs of digests: a read-only view that follows the graph."""
        return self._labeled.keys()

    def hint(self, digest: str) -> str | None:
        """What the labels say about one image, in words; None when it has no labels."""
        if digest not in self._parent:
            return None
        same, different = self._counts[True].get(digest, 0), self._counts[False].get(digest, 0)
        text = f"labeled same as {same} image{'s' if same != 1 else ''}, different from {different}"
        implied = len(self._members[self._find(digest)]) - 1 - same
        if implied > 0:
            text += f"; in a group of {implied + same + 1} same images"
        return text

    def contradicting(self) -> list[str]:
        """The ids of "different" labels inside a "same" group, sorted (no paths: see :meth:`contradiction`)."""
        return sorted(self._contradicting)

    def contradictions(self) -> list[Contradiction]:
        """Each "different" label inside a "same" group, with the shortest "same" path that contradicts it,
        in the order of the "different" labels' ids."""
        return [self.contradiction(pair_id) for pair_id in self.contradicting()]

    def contradiction(self, pair_id: str) -> Contradiction:
        """The contradiction of one "different" label (see :meth:`contradicting`)."""
        if pair_id not in self._contradicting:
            raise KeyError(f"label {pair_id!r} contradicts nothing")
        edge = self._edges[pair_id]
        images, pair_ids = self._same_path(edge.image_a, edge.image_b)
        chain = " = ".join(_short(d) for d in images)
        return Contradiction(
            pair_ids=(edge.pair_id, *pair_ids),
            images=tuple(images),
            explanation=(
                f"{_short(edge.image_a)} and {_short(edge.image_b)} are labeled different, but the "
                f"'same' labels {chain} make them the same; one of these {len(pair_ids) + 1} labels is wrong"
            ),
        )

    def _same_path(self, start: str, goal: str) -> tuple[list[str], list[str]]:
        """Breadth-first: the fewest "same" edges from ``start`` to ``goal`` (images, pair ids); among
        equally short paths, the one through the smallest digests (so the answer depends on the labels
        alone, not on the order they came in)."""
        came_from: dict[str, tuple[str, str] | None] = {start: None}
        queue = deque([start])
        while queue:
            image = queue.popleft()
            if image == goal:
                break
            for neighbour, pair_id in sorted((n, p) for p, n in self._same_adjacent.get(image, {}).items()):
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
            max_count = 4 * len(self._edges)
        members = {root: sorted(group) for root, group in self._members.items()}
        contradictory = {self._find(self._edges[pair_id].image_a) for pair_id in self._contradicting}
        # Blocks of candidate pairs: ("same", group) or ("different", group, group), each with its size.
        blocks: list[tuple[str, str, str | None, int]] = []
        for root in sorted(members):
            n = len(members[root])
            if root not in contradictory and n > 2:
                blocks.append(("same", root, None, n * (n - 1) // 2))
        different_groups = set()
        for e in self._edges.values():
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
