"""Which unlabeled pair to label next: the one that would teach the model most.

Each suggestion is one of four kinds, and says why it was chosen:

- ``uncertain``: the model's similarity is closest to its threshold (it cannot tell);
- ``hard_positive``: of the pairs that a model-independent view (raw-pixel thumbnails, or the initial
  model) finds most alike (top 2%), the one the model finds least alike;
- ``hard_negative``: of the pairs that view finds unlike (below its median), the one the model finds
  most alike;
- ``join``: an image that no "same" label places yet, beside the member of the labeled group the model
  finds most like it (``join_share`` of the model's suggestions, once groups exist). One label then places it in that
  group or apart from all of it: with a group of n images it implies n more pairs (A=B, B=C ⇒ A=C;
  A=B, B≠C ⇒ A≠C), so labels grow into many. When the model finds it unlike every group, its partner is
  the most similar other unplaced image, which may start a new group;
- ``merge``: half of the ``join`` draws, when two labeled groups are not yet set apart: the closest members of
  the two groups whose centres the model finds most alike. One label joins the groups or sets them apart,
  and implies |A|·|B| pairs: what keeps the groups of one kind from staying many small ones;
- ``random``: a uniformly random pair (``random_share`` of suggestions), so the labels never become a
  sample only of what the model finds hard, and metrics on them stay honest.

Both compare percentiles among the sampled pairs, so the two views' similarity scales need not agree.

When the threshold splits none of the sampled pairs (a model nobody has calibrated), an uncertain pick is
meaningless and a hard positive is suggested instead: with many classes, likely "same" pairs are the rare,
valuable ones.

The model's share splits between uncertain, hard positive and hard negative pairs by how often each kind
has lately found the model wrong: a suggestion remembers whether the model called its pair same, and once
the pair is labeled (seen through ``groups``) the answer says whether the model was right (only under a
calibrated threshold: before the first training the model's verdict means nothing). Each kind keeps
its last ``KIND_WINDOW`` answers and gets at least ``KIND_FLOOR`` of the share; without answers the share
splits in thirds. On digits, after 300 labels the hard negatives (pairs that look different, that the model
calls same) were "same" 93–100% of the time: the model had learned them, and those labels taught little.

Suggestions spread over the pool: images already in many labeled or recently suggested pairs are
penalized. A fixed, seeded share of the pool (:func:`is_evaluation_image`, derived from each image's
digest, nothing stored) is never suggested, so it stays a random sample for honest measurement.

It is fast for pools of 100,000: each call scores ``anchors`` × ``candidates`` sampled pairs (one matrix
product), never all N² of them.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Container, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from PIL import Image

EVALUATION_PERCENT = 10  # share of pool images reserved for evaluation: never suggested
MERGE_SHARE = 0.5  # of the join draws, those that first look for two groups to merge
MODEL_KINDS = ("uncertain", "hard_positive", "hard_negative")  # the kinds whose share follows their record
KIND_WINDOW = 30  # answers per model kind that decide its share
KIND_FLOOR = 0.05  # of the model's share, what each of its kinds keeps however rarely it finds a mistake
PENDING = 512  # suggestions remembered until their answer comes (older ones are forgotten)
KINDS = ("uncertain", "hard_positive", "hard_negative", "join", "merge", "random")


def is_evaluation_image(digest: str, percent: int = EVALUATION_PERCENT) -> bool:
    """Whether an image is reserved for evaluation: a bucket of its digest, the same on every machine.

    Salted, so the reserve is independent of the store's train/val split (which hashes pair ids).
    """
    bucket = int(hashlib.sha256(b"siamese-evaluation:" + digest.encode()).hexdigest()[:8], 16) % 100
    return bucket < percent


def thumbnail_vectors(images: Sequence[Image.Image], size: int = 8) -> torch.Tensor:
    """(N, 3·size²) unit rows: tiny mean-centred RGB thumbnails, a model-independent view of "looks alike"."""
    if not images:
        return torch.empty(0, 3 * size * size)
    rows = np.stack(
        [np.asarray(im.convert("RGB").resize((size, size), Image.Resampling.BOX), dtype=np.float32) for im in images]
    ).reshape(len(images), -1)
    rows -= rows.mean(axis=1, keepdims=True)  # brightness alone does not make two images alike
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return torch.from_numpy(rows / np.maximum(norms, 1e-6))


class Groups(Protocol):
    """What the labels say about images as groups (``siamese.labelgraph.LabelGraph`` is one)."""

    def group_members(self) -> Mapping[str, AbstractSet[str]]:
        """Each group's images, by group id."""

    def relation(self, image_a: str, image_b: str) -> bool | None:
        """True (same group), False (labeled different, stated or implied) or None (unknown)."""


@dataclass(frozen=True)
class Suggestion:
    """A pair to label, its similarity under the current model, and why it was chosen."""

    image_a: str
    image_b: str
    similarity: float
    reason: str
    kind: str  # one of KINDS

    def to_dict(self) -> dict:
        """The dict ``/suggest_pair`` returns beside the two images."""
        return {"similarity": self.similarity, "reason": self.reason, "kind": self.kind}


class Suggester:
    """Picks pairs to label; keeps the recent suggestions so it does not repeat itself. Thread-safe.

    Args:
        seed: the random stream (same seed and inputs ⇒ same suggestions).
        random_share: fraction of suggestions that are uniformly random pairs.
        join_share: of the other suggestions, the fraction that grow the labeled groups (``join`` and
            ``merge``; when ``groups`` are given and some group has two images); the rest goes to uncertain,
            hard positive and hard negative pairs, by how often each kind's answers found the model wrong.
        evaluation_percent: share of pool images never suggested (see :func:`is_evaluation_image`).
        anchors: images scored per call, drawn favouring rarely used ones.
        candidates: partners each anchor is scored against (a random sample of the pool).
        band: similarity scale of "near the threshold" (a pair ``band`` away scores e^-1 as uncertain).
        usage_penalty: how strongly an image's use in labeled/recent pairs lowers a pair's score.
        recent: how many past suggestions count as used (and are never repeated).
        lookalike_share: hard positives come from this top share of pairs by the model-independent view.
    """

    def __init__(
        self,
        seed: int = 0,
        random_share: float = 0.2,
        join_share: float = 0.5,
        evaluation_percent: int = EVALUATION_PERCENT,
        anchors: int = 256,
        candidates: int = 4096,
        band: float = 0.1,
        usage_penalty: float = 0.5,
        recent: int = 64,
        lookalike_share: float = 0.02,
    ):
        if not 0.0 <= random_share <= 1.0:
            raise ValueError(f"random_share must be in [0, 1], got {random_share}")
        if not 0.0 <= join_share <= 1.0:
            raise ValueError(f"join_share must be in [0, 1], got {join_share}")
        if not 0 <= evaluation_percent < 100:
            raise ValueError(f"evaluation_percent must be in [0, 100), got {evaluation_percent}")
        self.random_share = random_share
        self.join_share = join_share
        self.evaluation_percent = evaluation_percent
        self.anchors = anchors
        self.candidates = candidates
        self.band = band
        self.usage_penalty = usage_penalty
        self.lookalike_share = lookalike_share
        self._rng = np.random.default_rng(seed)
        self._recent: deque[frozenset[str]] = deque(maxlen=recent)
        self._lock = threading.Lock()
        self._reserved: dict[str, bool] = {}  # digest -> evaluation-only (memoized: hashing 100k costs 0.1 s)
        self._pending: OrderedDict[frozenset[str], tuple[str, bool]] = OrderedDict()  # pair -> (kind, model said same)
        self._caught: dict[str, deque[bool]] = {k: deque(maxlen=KIND_WINDOW) for k in MODEL_KINDS}  # model wrong?

    def kind_record(self) -> dict[str, tuple[int, int, float]]:
        """Per model kind: (answers that found the model wrong, answers, share of the model's suggestions)."""
        with self._lock:
            shares = self._model_shares()
            return {k: (sum(self._caught[k]), len(self._caught[k]), shares[k]) for k in MODEL_KINDS}

    def _model_shares(self) -> dict[str, float]:
        """The model's share split by each kind's smoothed rate of finding the model wrong, with a floor."""
        rates = {k: (sum(h) + 1) / (len(h) + 2) for k, h in self._caught.items()}  # Laplace: no answers → ½
        total = sum(rates.values())
        free = 1.0 - KIND_FLOOR * len(rates)
        return {k: KIND_FLOOR + free * rate / total for k, rate in rates.items()}

    def _learn(self, labeled: Container[frozenset[str]], groups: Groups) -> None:
        """Moves the remembered suggestions that have been labeled into their kind's record."""
        for pair in [p for p in self._pending if p in labeled]:
            kind, said_same = self._pending.pop(pair)
            same = groups.relation(*sorted(pair))
            if same is not None:
                self._caught[kind].append(same != said_same)

    def _remember(self, suggestion: Suggestion, threshold: float) -> None:
        pair = frozenset((suggestion.image_a, suggestion.image_b))
        self._pending[pair] = (suggestion.kind, suggestion.similarity >= threshold)
        while len(self._pending) > PENDING:
            self._pending.popitem(last=False)

    def _model_kind(self, u: float) -> str:
        """The model kind for a uniform draw ``u`` in [0, 1): thirds until the kinds have answers."""
        shares = self._model_shares()
        edge = 0.0
        for kind in MODEL_KINDS[:-1]:
            edge += shares[kind]
            if u < edge:
                return kind
        return MODEL_KINDS[-1]

    def _eligible(self, pool: Sequence[str]) -> np.ndarray:
        reserved = self._reserved
        for digest in pool:
            if digest not in reserved:
                reserved[digest] = is_evaluation_image(digest, self.evaluation_percent)
        return np.fromiter((i for i, d in enumerate(pool) if not reserved[d]), dtype=np.int64)

    def suggest(
        self,
        pool: Sequence[str],
        embeddings: torch.Tensor,
        threshold: float,
        labeled: Container[frozenset[str]],
        usage: Mapping[str, int] | None = None,
        reference: torch.Tensor | None = None,
        groups: Groups | None = None,
        calibrated: bool = True,
    ) -> Suggestion | None:
        """The next pair to label, or None when the pool has no unlabeled pair outside the reserve.

        ``labeled`` and ``usage`` are only looked up, never copied or iterated, so they may be live views
        of a large label graph (``LabelGraph.labeled()``, ``LabelGraph.usage()``).

        Args:
            pool: image digests; row i of ``embeddings`` (and ``reference``) belongs to ``pool[i]``.
            embeddings: (N, D) unit rows under the current model.
            threshold: the current model's decision threshold (cosine similarity).
            labeled: the labeled pairs (unordered), never suggested again (anything supporting ``in``).
            usage: how many labeled pairs each image is in (``LabelGraph.usage()``).
            reference: (N, D') unit rows of a model-independent view (:func:`thumbnail_vectors`, or the
                initial model's embeddings); without it, no hard positives or negatives are suggested.
            groups: the labels' groups (the ``LabelGraph``); without it, no ``join`` or ``merge`` pairs are suggested.
            calibrated: whether ``threshold`` was calibrated on labels (False before the first training): the
                answers to suggestions made under a threshold nobody calibrated do not count for their kind.
        """
        if embeddings.ndim != 2 or embeddings.shape[0] != len(pool):
            raise ValueError(f"need one embedding row per pool image; got {tuple(embeddings.shape)} for {len(pool)}")
        if reference is not None and reference.shape[0] != len(pool):
            raise ValueError(f"need one reference row per pool image; got {tuple(reference.shape)} for {len(pool)}")
        with self._lock:
            eligible = self._eligible(pool)
            if len(eligible) < 2:
                return None
            if groups is not None:
                self._learn(labeled, groups)
            used = _Uses(usage or {}, Counter(d for pair in self._recent for d in pair))
            blocked = _Blocked(labeled, set(self._recent))
            draw = self._rng.random()
            join_end = self.random_share + (1 - self.random_share) * (self.join_share if groups is not None else 0.0)
            if draw < self.random_share:
                kind = "random"
            elif draw < join_end:
                kind = "join"
            elif reference is None:
                kind = "uncertain"
            else:  # the rest of the model's share, by each kind's record
                kind = self._model_kind((draw - join_end) / max(1e-12, 1 - join_end))
            # numpy, not torch, for these small products: torch's thread pool spins when the cores are
            # shared (a 200 × 200 product took 23 ms instead of 0.02 ms)
            embeddings = _as_array(embeddings)
            reference = _as_array(reference) if reference is not None else None
            found = None
            if kind == "join":
                found = self._joined(pool, eligible, embeddings, threshold, blocked, used, groups)
                if found is None:  # no group of two yet: look for likely "same" pairs, which start groups
                    kind = "hard_positive" if reference is not None else "uncertain"
            if kind != "random" and found is None:
                found, splits = self._scored(pool, eligible, embeddings, threshold, blocked, used, reference, kind)
                if found is not None and calibrated and splits:  # else the model's verdict means nothing
                    self._remember(found, threshold)
            if found is None:
                found = self._random(pool, eligible, embeddings, blocked)
            if found is not None:
                self._recent.append(frozenset((found.image_a, found.image_b)))
            return found

    def suggest_batch(
        self,
        count: int,
        pool: Sequence[str],
        embeddings: torch.Tensor,
        threshold: float,
        labeled: Iterable[frozenset[str]],
        usage: Mapping[str, int] | None = None,
        reference: torch.Tensor | None = None,
    ) -> list[Suggestion]:
        """``count`` distinct suggestions at once (fewer when the pool runs out), spread over the pool.

        No ``join`` pairs: placing an image needs the answer to the previous suggestion."""
        labeled, usage = set(labeled), Counter(usage or {})
        found: list[Suggestion] = []
        while len(found) < count:
            suggestion = self.suggest(pool, embeddings, threshold, labeled, usage, reference)
            if suggestion is None:
                break
            found.append(suggestion)
            labeled.add(frozenset((suggestion.image_a, suggestion.image_b)))
            usage.update((suggestion.image_a, suggestion.image_b))
        return found

    # -- the model's picks

    def _scored(self, pool, eligible, embeddings, threshold, blocked, used, reference, kind):
        """The best pair of ``kind`` among sampled pairs, or None; and whether the threshold splits them."""
        rng = self._rng
        uses = np.array([used.get(pool[i], 0) for i in eligible], dtype=np.float64)
        weights = 1.0 / (1.0 + uses) ** 2  # rarely used images anchor more often
        n_anchors = min(self.anchors, len(eligible))
        keys = np.log(weights) + rng.gumbel(size=len(eligible))  # Gumbel top-k: a weighted draw without replacement
        anchors = np.argpartition(-keys, n_anchors - 1)[:n_anchors]
        partners = rng.choice(len(eligible), min(self.candidates, len(eligible)), replace=False)
        a_rows, b_rows = eligible[anchors], eligible[partners]  # pool rows
        sims = (embeddings[a_rows] @ embeddings[b_rows].T).astype(np.float64)  # (A, C)
        penalty = 1.0 / (1.0 + self.usage_penalty * (uses[anchors][:, None] + uses[partners][None, :]))
        invalid = a_rows[:, None] == b_rows[None, :]
        splits = bool(0.01 < (sims >= threshold).mean() < 0.99)
        if kind == "uncertain" and reference is not None and not splits:
            kind = "hard_positive"  # the threshold splits nothing (an uncalibrated model): look for likely "same"s
        if kind == "uncertain":
            score = np.exp(-(((sims - threshold) / self.band) ** 2))
        else:
            looks = (reference[a_rows] @ reference[b_rows].T).astype(np.float64)  # (A, C)
            valid = np.flatnonzero(~invalid.ravel())  # an image with itself would top every "looks alike"
            sample = valid[rng.choice(valid.size, min(valid.size, 20_000), replace=False)]
            model_rank = _ranks(sims, sims.ravel()[sample])  # where each pair stands among the scored pairs
            looks_rank = _ranks(looks, looks.ravel()[sample])
            if kind == "hard_positive":  # among the pairs that look most alike, the ones the model finds least alike
                score = np.where(looks_rank >= 1.0 - self.lookalike_share, 1.0 - model_rank, 0.0)
            else:  # among the pairs that look unlike (below the median), the ones the model finds most alike
                score = np.where(looks_rank <= 0.5, model_rank, 0.0)
        score = np.where(invalid, -np.inf, score * penalty)
        flat_scores = score.ravel()
        top = np.argpartition(-flat_scores, min(511, flat_scores.size - 1))[:512]
        for flat in top[np.argsort(-flat_scores[top], kind="stable")]:
            i, j = divmod(int(flat), score.shape[1])
            if not np.isfinite(score[i, j]) or score[i, j] <= 0:
                return None, splits
            a, b = pool[a_rows[i]], pool[b_rows[j]]
            if frozenset((a, b)) in blocked:
                continue
            similarity = float(sims[i, j])
            if kind == "uncertain":
                reason = _reason_uncertain(similarity, threshold, self.band)
            else:
                reason = _reason_hard(kind, similarity, threshold, float(model_rank[i, j]), float(looks_rank[i, j]))
            return Suggestion(a, b, similarity, reason + self._record_note(kind), kind), splits
        return None, splits

    def _record_note(self, kind: str) -> str:
        answers = self._caught[kind]
        if not answers:
            return ""
        return f"; this kind found the model wrong in {sum(answers)} of its last {len(answers)} answered picks"

    def _joined(self, pool, eligible, embeddings, threshold, blocked, used, groups) -> Suggestion | None:
        """A pair that grows the labeled groups: half the time (when there is one) two groups the model
        finds alike (:meth:`_merge`), else an unplaced image against its most similar group (:meth:`_place`)."""
        row_of = {pool[i]: int(i) for i in eligible}
        member_rows, member_group, sizes = [], [], []
        for members in groups.group_members().values():
            if len(members) < 2:
                continue
            rows = [
                row_of[d] for d in sorted(members) if d in row_of
            ]  # sorted: a set's order varies by process; reserved images never
            if rows:
                member_rows += rows
                member_group += [len(sizes)] * len(rows)
                sizes.append(len(members))
        if not member_rows:
            return None
        member_rows, member_group = np.array(member_rows), np.array(member_group)
        found = None
        if len(sizes) > 1 and self._rng.random() < MERGE_SHARE:
            found = self._merge(pool, embeddings, threshold, blocked, groups, member_rows, member_group, sizes)
        return found or self._place(
            pool, eligible, embeddings, threshold, blocked, used, groups, member_rows, member_group, sizes
        )

    def _merge(self, pool, embeddings, threshold, blocked, groups, member_rows, member_group, sizes):
        """Two groups whose centres the model finds most alike, not yet set apart, by their closest members:
        one label joins them (|A|·|B| implied "same" pairs) or sets them apart (as many "different")."""
        rng = self._rng
        n_groups = len(sizes)
        chosen = np.arange(n_groups)
        if n_groups > 1024:  # a G × G product stays small
            chosen = np.sort(rng.choice(n_groups, 1024, replace=False))
        position = np.full(n_groups, -1)
        position[chosen] = np.arange(len(chosen))
        keep = position[member_group] >= 0
        rows, where = member_rows[keep], position[member_group[keep]]
        centres = np.zeros((len(chosen), embeddings.shape[1]), dtype=np.float64)
        np.add.at(centres, where, embeddings[rows])
        centres /= np.maximum(np.linalg.norm(centres, axis=1, keepdims=True), 1e-12)
        alike = centres @ centres.T  # (G, G)
        alike[np.tril_indices(len(chosen))] = -np.inf
        flat = np.argsort(-alike, axis=None)[:64]
        for gi, gj in zip(*np.unravel_index(flat, alike.shape), strict=True):
            similarity = float(alike[gi, gj])
            if similarity < threshold:
                return None
            rows_i, rows_j = rows[where == gi][:64], rows[where == gj][:64]
            if groups.relation(pool[rows_i[0]], pool[rows_j[0]]) is not None:
                continue  # already set apart by a label
            closest = embeddings[rows_i] @ embeddings[rows_j].T
            for flat_ij in np.argsort(-closest, axis=None)[:16]:
                i, j = np.unravel_index(flat_ij, closest.shape)
                a, b = pool[rows_i[i]], pool[rows_j[j]]
                if frozenset((a, b)) in blocked:
                    continue
                size_a, size_b = sizes[chosen[gi]], sizes[chosen[gj]]
                reason = (
                    f"merge: the model finds two labeled groups alike ({size_a} and {size_b} images, similarity "
                    f"{similarity:.2f} between their centres, threshold {threshold:.2f}): one label joins them or "
                    f"sets them apart, and implies {size_a * size_b - 1} more pairs"
                )
                return Suggestion(a, b, float(closest[i, j]), reason, "merge")
        return None

    def _place(self, pool, eligible, embeddings, threshold, blocked, used, groups, member_rows, member_group, sizes):
        """An unplaced image (in no group of two or more), beside the nearest member of the group the model
        finds most like it; or, when it finds every group unlike, beside the most similar unplaced image."""
        rng = self._rng
        placed = np.zeros(len(pool), dtype=bool)
        placed[member_rows] = True
        unplaced = eligible[~placed[eligible]]
        if len(unplaced) < 2:
            return None
        if len(member_rows) > self.candidates:  # a uniform sample of the members keeps each call bounded
            keep = rng.choice(len(member_rows), self.candidates, replace=False)
            member_rows, member_group = member_rows[keep], member_group[keep]
        uses = np.array([used.get(pool[i], 0) for i in unplaced], dtype=np.float64)
        n_anchors = min(self.anchors, len(unplaced))
        keys = -2.0 * np.log1p(uses) + rng.gumbel(size=len(unplaced))  # rarely used first, in random order
        anchors = unplaced[np.argsort(-keys)[:n_anchors]]
        others = unplaced[rng.choice(len(unplaced), min(self.candidates, len(unplaced)), replace=False)]
        to_members = embeddings[anchors] @ embeddings[member_rows].T  # (A, M)
        to_others = embeddings[anchors] @ embeddings[others].T  # (A, C)
        for i, row in enumerate(anchors):
            a = pool[row]
            # the best member first: a group the labels already set apart from this image is passed over
            for j in np.argsort(-to_members[i])[:64]:
                similarity = float(to_members[i, j])
                if similarity < threshold:
                    break
                b = pool[member_rows[j]]
                if frozenset((a, b)) in blocked or groups.relation(a, b) is not None:
                    continue
                size = sizes[member_group[j]]
                reason = (
                    f"join: no label places this image yet; the model finds it most like a labeled group of "
                    f"{size} (similarity {similarity:.2f} to its nearest member, threshold {threshold:.2f}): one "
                    f"label places it in that group or apart from all {size}"
                )
                return Suggestion(a, b, similarity, reason, "join")
            for j in np.argsort(-to_others[i])[:8]:
                b = pool[others[j]]
                if b == a or frozenset((a, b)) in blocked or groups.relation(a, b) is not None:
                    continue
                similarity = float(to_others[i, j])
                reason = (
                    f"join: the model finds this image unlike every labeled group; beside the most similar "
                    f"unplaced image (similarity {similarity:.2f}, threshold {threshold:.2f}) it may start a new group"
                )
                return Suggestion(a, b, similarity, reason, "join")
        return None

    def _random(self, pool, eligible, embeddings, blocked) -> Suggestion | None:
        rng = self._rng
        for _ in range(200):
            i, j = rng.choice(len(eligible), 2, replace=False)
            a, b = pool[eligible[i]], pool[eligible[j]]
            if a != b and frozenset((a, b)) not in blocked:
                similarity = float(embeddings[eligible[i]] @ embeddings[eligible[j]])
                return Suggestion(a, b, similarity, "random: keeps the data unbiased", "random")
        return None  # 200 misses: nearly every pair is labeled (tiny pools); nothing left worth suggesting


class _Uses:
    """How often each image was used: in labeled pairs (``usage``) plus in recent suggestions."""

    def __init__(self, usage: Mapping[str, int], recent: Counter[str]):
        self.usage, self.recent = usage, recent

    def get(self, digest: str, default: int = 0) -> int:
        return self.usage.get(digest, default) + self.recent.get(digest, 0)


class _Blocked:
    """Pairs never suggested: the labeled ones and the recent suggestions."""

    def __init__(self, labeled: Container[frozenset[str]], recent: set[frozenset[str]]):
        self.labeled, self.recent = labeled, recent

    def __contains__(self, pair: frozenset[str]) -> bool:
        return pair in self.recent or pair in self.labeled


def _as_array(rows) -> np.ndarray:
    """(N, D) float32 numpy rows from a tensor (inference tensors included) or an array."""
    if isinstance(rows, torch.Tensor):
        return rows.detach().to("cpu", torch.float32).numpy()
    return np.asarray(rows, dtype=np.float32)


def _ranks(values: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """Each value's quantile (0…1) among ``sample``: comparable across the model's and the view's scales.

    Cosine similarities lie in [-1, 1]: a histogram of the sample in 4,096 fixed bins gives the cumulative
    share by one index per value (a binary search of a million values costs twenty times more).
    """
    bins = 4096
    index = np.clip(((values + 1.0) * (bins / 2)).astype(np.int64), 0, bins - 1)
    sample_index = np.clip(((sample + 1.0) * (bins / 2)).astype(np.int64), 0, bins - 1)
    counts = np.bincount(sample_index, minlength=bins)
    midrank = (np.cumsum(counts) - 0.5 * counts) / max(1, sample.size)  # ties share a rank: all-equal → 0.5
    return midrank[index]


def _reason_uncertain(similarity: float, threshold: float, band: float) -> str:
    where = "near" if abs(similarity - threshold) <= band else "the closest of the pairs scored to"
    return f"uncertain: similarity {similarity:.2f} is {where} the threshold {threshold:.2f}"


def _reason_hard(kind: str, similarity: float, threshold: float, model_rank: float, looks_rank: float) -> str:
    verdict = "same" if similarity >= threshold else "different"
    model = (
        f"the model ranks them at percentile {100 * model_rank:.0f} (similarity {similarity:.2f}, "
        f"threshold {threshold:.2f}: it calls them {verdict})"
    )
    if kind == "hard_positive":
        return f"hard positive: they look alike (percentile {100 * looks_rank:.0f} of pairs) but {model}"
    return f"hard negative: they look different (percentile {100 * looks_rank:.0f} of pairs) but {model}"
