"""Benchmark: the label graph kept up to date in the service, next to rebuilding it from the store per call.

Fills a store with ``--pairs`` labels (default 100,000) over ``--images`` pool images in classes of
``--class-size``: 40% "same" pairs inside a class, 60% "different" pairs across classes, and a few wrong
labels (``--mistakes`` "same" pairs labeled different, a tenth as many cross-class "different" pairs labeled
same), so the graph has big groups and contradictions to review. Then times, on a ``ModelService`` over
that store (``small_cnn``, the pool fully indexed first):

- the graph brought up to date (``ModelService._labels``) after no change, one new label, a relabel that
  splits a group, and a delete; next to ``LabelGraph.from_pairs(store.all_pairs())``, what each question
  cost before the graph was kept;
- ``pair_to_judge`` (a suggestion: the contradictions were all offered once before timing) with the kept
  graph, and with the graph rebuilt from the store on each call, in the same run.

    python benchmarks/bench_graph.py                            # 100,000 pairs (a few minutes to fill)
    python benchmarks/bench_graph.py --pairs 5000 --images 1000 # quick
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from siamese.config import Settings
from siamese.labelgraph import LabelGraph
from siamese.service import ModelService
from siamese.store import NewPair, PairStore, pair_id_for


def tiny_png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def fill(store: PairStore, args: argparse.Namespace) -> None:
    """The pool and the labels: classes of ``class_size`` consecutive images, then a few labels flipped."""
    rng = random.Random(args.seed)
    digests = [store.add_image(tiny_png(args.seed * 1_000_003 + i)) for i in range(args.images)]
    size, classes = args.class_size, args.images // args.class_size
    seen: set[str] = set()
    rows: list[NewPair] = []
    while len(rows) < args.pairs:
        if rng.random() < 0.4:
            c = rng.randrange(classes)
            (a, b), label = rng.sample(digests[c * size : (c + 1) * size], 2), "same"
        else:
            ca, cb = rng.sample(range(classes), 2)
            a, b, label = (
                digests[ca * size + rng.randrange(size)],
                digests[cb * size + rng.randrange(size)],
                "different",
            )
        if (pair_id := pair_id_for(a, b)) not in seen:
            seen.add(pair_id)
            rows.append(NewPair(a, b, label, "bench"))
    flipped = {"same": "different", "different": "same"}
    for label, count in (("same", args.mistakes), ("different", args.mistakes // 10)):
        for i in rng.sample([i for i, row in enumerate(rows) if row.label == label], count):
            rows[i] = rows[i]._replace(label=flipped[label])
    for start in range(0, len(rows), 5000):
        store.add_pairs(rows[start : start + 5000])


def median_ms(call: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> float:
    """Median milliseconds of ``call`` (``before`` runs untimed ahead of each)."""
    samples = []
    for _ in range(repeats):
        if before is not None:
            before()
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=100_000, help="labels in the store")
    parser.add_argument("--images", type=int, default=5000, help="pool images")
    parser.add_argument("--class-size", type=int, default=20, help="images per class")
    parser.add_argument("--mistakes", type=int, default=40, help="'same' pairs labeled different (contradictions)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (5 for rebuilds)")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the store (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix="bench-graph-") as work:
            return run(args, Path(work))
    return run(args, args.dir)


def run(args: argparse.Namespace, work: Path) -> None:
    data = work / "siamese"
    started = time.perf_counter()
    if not (data / "labels.sqlite3").exists():
        print(f"filling {data} with {args.images:,} images and {args.pairs:,} pairs ...", flush=True)
        with PairStore(data) as store:
            fill(store, args)
    service = ModelService(Settings(data_dir=data, backbone="small_cnn", pretrained=False), background=False)
    store = service.store
    service._index(limit=None)  # the whole pool embedded: the timings below are the graph's and the suggester's
    print(f"ready in {time.perf_counter() - started:.1f} s; timing ...\n", flush=True)
    rng = random.Random(args.seed + 1)
    pool = store.pool()

    def rebuild() -> LabelGraph:
        return LabelGraph.from_pairs(store.all_pairs())

    def look() -> None:
        with service._labels():
            pass

    rows: list[tuple[str, float, float]] = []
    first = median_ms(look, 5, before=lambda: setattr(service, "_graph", None))
    rebuilt = median_ms(rebuild, 5)
    rows.append(("first look: build from the store, read the event log", first, rebuilt))
    rows.append(("graph up to date, nothing changed", median_ms(look, args.repeats), rebuilt))

    def label_one() -> None:
        while True:
            a, b = rng.sample(pool, 2)
            if store.get_pair(pair_id_for(a, b)) is None:
                service.label_known(a, b, rng.choice(("same", "different")), "bench")
                return

    rows.append(("… after one new label", median_ms(look, args.repeats, before=label_one), rebuilt))
    with service._labels() as graph:
        same = rng.sample([e.pair_id for e in graph.edges if e.same], args.repeats)

    def split_one() -> None:
        service.relabel(same.pop(), "different", "bench")

    rows.append(
        ("… after relabeling a 'same' label 'different'", median_ms(look, args.repeats, before=split_one), rebuilt)
    )
    victims = rng.sample([p.pair_id for p in store.list_pairs(limit=5000)], args.repeats)
    rows.append(
        (
            "… after deleting a label",
            median_ms(look, args.repeats, before=lambda: service.delete_pair(victims.pop())),
            rebuilt,
        )
    )

    # pair_to_judge: offer every contradiction once, so each timed call is a suggestion
    reviews = 0
    while service.pair_to_judge()[2]["reason"].startswith("review:"):
        reviews += 1
    kept = median_ms(service.pair_to_judge, args.repeats)

    @contextmanager
    def rebuilt_labels():  # the graph as every question built it before: all pairs, from the store
        yield rebuild()

    service._labels = rebuilt_labels
    rebuilding = median_ms(service.pair_to_judge, 5)
    del service._labels
    rows.append(("pair_to_judge (a suggestion)", kept, rebuilding))

    with service._labels() as graph:
        assert graph.edges and {e.pair_id for e in graph.edges} == {e.pair_id for e in rebuild().edges}
        groups, contradictions = len(graph.groups()), len(graph.contradicting())
    print(
        f"{store.counts().total:,} pairs over {len(pool):,} images: {groups:,} groups, {contradictions} contradictions "
        f"({reviews} offered for review before timing); medians of {args.repeats} calls (5 for rebuilds)\n"
    )
    header = ("measurement", "kept graph ms", "rebuilt from store ms", "ratio")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for name, ours, theirs in rows:
        ratio = theirs / ours
        print(
            f"{name} | {ours:.2f} | {theirs:.1f} | {ratio:,.0f}x"
            if ratio >= 10
            else f"{name} | {ours:.2f} | {theirs:.1f} | {ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
