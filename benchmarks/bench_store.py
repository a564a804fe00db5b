"""Benchmark: the pair store on a filled database, next to the naive store a tutorial would write.

Fills a :class:`~siamese.store.PairStore` with ``--pairs`` labeled pairs (default 100,000), then times
single calls on it: labeling a new pair, a filtered page of 50, and the class counts. The reference is a
JSON file holding every pair, loaded and rewritten per label, timed in the same run on the same data.

    python benchmarks/bench_store.py                 # 100,000 pairs (about a minute)
    python benchmarks/bench_store.py --pairs 2000    # quick
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from siamese.store import NewPair, PairStore, pair_id_for

ANNOTATORS = ("ana", "ben", "chen", "dara", "eli")
TARGETS_MS = {"add a pair": 5.0, "page of 50, filtered": 50.0, "counts": 20.0}
START = datetime(2024, 1, 1, tzinfo=timezone.utc)


class JsonFileStore:
    """The tutorial way: one JSON list of pairs, read and rewritten whole on every label."""

    def __init__(self, path: Path):
        self.path = path

    def _load(self) -> list[dict]:
        return json.loads(self.path.read_text()) if self.path.exists() else []

    def add_pair(self, a: str, b: str, label: str, annotator: str, at: str) -> None:
        pairs = self._load()
        pairs = [p for p in pairs if {p["image_a"], p["image_b"]} != {a, b}]  # relabel replaces
        pairs.append({"image_a": a, "image_b": b, "label": label, "annotator": annotator, "created_at": at})
        self.path.write_text(json.dumps(pairs))

    def list_pairs(self, *, label: str, annotator: str, since: str, offset: int, limit: int) -> list[dict]:
        found = [
            p for p in self._load() if p["label"] == label and p["annotator"] == annotator and p["created_at"] >= since
        ]
        found.sort(key=lambda p: p["created_at"], reverse=True)
        return found[offset : offset + limit]

    def counts(self) -> dict[str, int]:
        pairs = self._load()
        same = sum(p["label"] == "same" for p in pairs)
        return {"same": same, "different": len(pairs) - same, "total": len(pairs)}


def tiny_png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def timed(call: Callable[[int], object], repeats: int) -> list[float]:
    """Milliseconds per call, one sample per repeat (the argument is the repeat's index)."""
    samples = []
    for i in range(repeats):
        start = time.perf_counter()
        call(i)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=100_000, help="pairs to fill the store with")
    parser.add_argument("--images", type=int, default=None, help="pool size (default: enough for the pairs)")
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per operation on the store")
    parser.add_argument("--reference-repeats", type=int, default=10, help="timed calls per operation, reference")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the stores (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dir is None:  # a temporary directory, removed afterwards
        with tempfile.TemporaryDirectory(prefix="bench-store-") as work:
            return run(args, Path(work))
    return run(args, args.dir)


def run(args: argparse.Namespace, work: Path) -> None:
    n_images = args.images or max(100, int((8 * args.pairs) ** 0.5))
    rng = random.Random(args.seed)

    print(f"filling {work} with {n_images:,} images and {args.pairs:,} pairs ...", flush=True)
    started = time.perf_counter()
    store = PairStore(work / "siamese")
    digests = [store.add_image(tiny_png(args.seed * 1_000_003 + i)) for i in range(n_images)]
    seen: set[str] = set()
    rows: list[NewPair] = []
    while len(rows) < args.pairs:
        a, b = rng.sample(digests, 2)
        if (pair_id := pair_id_for(a, b)) in seen:
            continue
        seen.add(pair_id)
        at = (START + timedelta(seconds=rng.randrange(90 * 86400))).isoformat()
        rows.append(NewPair(a, b, rng.choice(("same", "different")), rng.choice(ANNOTATORS), at, at))
    for start in range(0, len(rows), 5000):
        store.add_pairs(rows[start : start + 5000])
    reference = JsonFileStore(work / "reference.json")
    keys = ("image_a", "image_b", "label", "annotator", "created_at")
    reference.path.write_text(json.dumps([{k: getattr(r, k) for k in keys} for r in rows]))
    print(f"filled in {time.perf_counter() - started:.1f} s; timing ...\n", flush=True)

    def fresh_pairs(count: int) -> list[tuple[str, str]]:
        found = []
        while len(found) < count:
            a, b = rng.sample(digests, 2)
            if (pair_id := pair_id_for(a, b)) not in seen:
                seen.add(pair_id)
                found.append((a, b))
        return found

    since = (START + timedelta(days=30)).isoformat()
    new = fresh_pairs(args.repeats + args.reference_repeats)
    now = datetime.now(timezone.utc).isoformat()
    ours = {
        "add a pair": timed(
            lambda i: store.add_pair(*new[i], rng.choice(("same", "different")), "bench"), args.repeats
        ),
        "page of 50, filtered": timed(
            lambda i: store.list_pairs(label="same", annotator=ANNOTATORS[i % 5], since=since, offset=(i % 4) * 50),
            args.repeats,
        ),
        "counts": timed(lambda i: store.counts(), args.repeats),
    }
    extra = new[args.repeats :]
    theirs = {
        "add a pair": timed(lambda i: reference.add_pair(*extra[i], "same", "bench", now), args.reference_repeats),
        "page of 50, filtered": timed(
            lambda i: reference.list_pairs(
                label="same", annotator=ANNOTATORS[i % 5], since=since, offset=(i % 4) * 50, limit=50
            ),
            args.reference_repeats,
        ),
        "counts": timed(lambda i: reference.counts(), args.reference_repeats),
    }
    # The two stores must agree, or the comparison means nothing.
    page = store.list_pairs(label="same", annotator="ana", since=since, limit=50)
    assert [p.created_at for p in page] == sorted((p.created_at for p in page), reverse=True)
    assert store.counts().total == args.pairs + args.repeats

    print(f"{args.pairs:,} pairs, {n_images:,} images; medians over {args.repeats} (store) and "
          f"{args.reference_repeats} (reference) calls\n")  # fmt: skip
    header = ("operation", "store median ms", "store p95 ms", "target ms", "ok", "JSON-file median ms", "ratio")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for name, samples in ours.items():
        median = statistics.median(samples)
        reference_median = statistics.median(theirs[name])
        ok = "yes" if median <= TARGETS_MS[name] else "NO"
        print(
            f"{name} | {median:.3f} | {percentile(samples, 95):.3f} | {TARGETS_MS[name]:.0f} | {ok} | "
            f"{reference_median:.1f} | {reference_median / median:,.0f}x faster"
        )
    store.close()


if __name__ == "__main__":
    main()
