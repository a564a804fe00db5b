"""Benchmark: label efficiency of suggested pairs versus random pairs, on scikit-learn's digits.

A pool of digit images is labeled in rounds, with the digits' true classes as the annotator. After each
round (50, 100, 200, 300, 500, 1,000 labels) ``small_cnn`` is trained on every label so far, continuing the
previous round's model (as the app's ``/train`` continues the active model; ``--fresh`` starts every round
from the seed's initial weights instead), and its ROC AUC is measured on fixed held-out pairs over images
that are never in the pool. Two arms share the pool, the initial weights and the training settings, and
differ only in who picks the pairs:

- ``suggested``: :class:`siamese.suggest.Suggester` as the app's ``/suggest_pair`` runs it (join and merge
  pairs that grow the labeled groups, uncertain, hard positive, hard negative in shares that follow how
  often each kind's answers found the model wrong, 20% random; the evaluation reserve never suggested;
  raw-pixel thumbnails as the model-independent view), one suggestion per label with the label graph of
  every answer so far, scoring the pool with the model and threshold of the previous round;
- ``random``: uniformly random pool pairs (the same class with ``random_share=1``, so the evaluation reserve
  is left out here too), what a user labels without suggestions.

Training is the product's ``TrainConfig`` (AdamW 3e-3, warmup + cosine, batch 64, light augmentation,
4 implied pairs per label in each epoch, 20 epochs) with two deviations, the same for both arms: every label trains
(the app holds out the pairs of 20% of the images for validation and drops the pairs across the split), so
there is no early stopping and the threshold is calibrated on the training pairs; and a round runs at least
``--steps`` optimizer steps (20 epochs of 50 labels are 20 steps, far from trained). ``--epoch-check``
trains the random arm with the schedule and with twice the schedule, side by side.

The goal: the suggested arm reaches the AUC that random pairs reach with 1,000 labels using at most half
as many. Prints a table (mean and min–max over the seeds) and the verdict, draws the curves into
``benchmarks/results/active.png`` (and ``--docs``), and saves every labeled pair to ``active.json``.

    python benchmarks/bench_active.py --seeds 0,1,2 --docs docs/active.png   # the full run (≈ 53 min, 1 thread)
    python benchmarks/bench_active.py --quick                                # 50 → 200 labels, about a minute
    python benchmarks/bench_active.py --seeds 0 --epoch-check                # random arm: schedule against 2×
    python benchmarks/bench_active.py --from-json benchmarks/results/active.json   # report a saved run again
    python benchmarks/bench_active.py --from-json s0.json s1.json --json all.json  # seeds run apart, as one
    python benchmarks/bench_active.py --seeds 3 --arms random --json r3.json      # one arm (report it with
                                                                                  # --from-json beside the other)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.digits import Digits, load_digits_images, sample_pairs, split_indices
from siamese.config import ModelConfig
from siamese.labelgraph import LabelGraph
from siamese.model import ContrastiveSiameseNetwork, build_model
from siamese.suggest import Suggester, thumbnail_vectors
from siamese.train import LabeledPair, TooFewLabels, TrainConfig, evaluate_model, implied_pairs, train_model

UNCALIBRATED_THRESHOLD = 0.5  # what the app uses before the first training
RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("suggested", "random")
COLOURS = {"suggested": (214, 39, 40), "random": (31, 119, 180)}


@dataclass
class Arm:
    """One way of choosing pairs, and everything it has labeled and learned so far (one seed)."""

    name: str
    suggester: Suggester
    model: ContrastiveSiameseNetwork
    threshold: float = UNCALIBRATED_THRESHOLD
    pairs: list[LabeledPair] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # why each pair was suggested, in label order
    similarities: list[float] = field(default_factory=list)  # each pair's similarity when it was suggested
    curve: list[tuple[int, float]] = field(default_factory=list)  # (labels, test AUC)
    rounds: list[dict] = field(default_factory=list)  # per round: threshold, epochs, steps, seconds
    seconds: float = 0.0


@dataclass
class Setup:
    """One seed's data: the pool, its oracle, the held-out test pairs and the initial weights."""

    seed: int
    digits: Digits
    pool: list[str]
    truth: dict[str, int]
    pixels: torch.Tensor  # (N, 3, 32, 32) preprocessed pool images
    reference: torch.Tensor  # (N, 192) raw-pixel thumbnails: the app's model-independent view
    test_pairs: list[LabeledPair]
    initial: ContrastiveSiameseNetwork


def make_setup(digits: Digits, seed: int, pool_size: int, n_test: int) -> Setup:
    pool_idx, test_idx = split_indices(len(digits), [pool_size, len(digits) - pool_size], seed=seed)
    pool = [digits.digests[i] for i in pool_idx]
    images = [digits.load_image(d) for d in pool]
    torch.manual_seed(seed)
    initial = build_model(ModelConfig(backbone="small_cnn", pretrained=False))
    return Setup(
        seed=seed,
        digits=digits,
        pool=pool,
        truth={digits.digests[i]: int(digits.classes[i]) for i in pool_idx},
        pixels=initial.preprocessing.to_tensor(images),
        reference=thumbnail_vectors(images),
        test_pairs=sample_pairs(digits, test_idx, n_test, seed=seed + 1, prefix="test"),
        initial=initial,
    )


@torch.no_grad()
def embed_pool(model: ContrastiveSiameseNetwork, batch: torch.Tensor) -> torch.Tensor:
    """(N, D) unit embeddings of a preprocessed (N, 3, H, W) batch, in eval mode (as the app's index)."""
    model.eval()
    return torch.cat([model.embed(batch[i : i + 256]) for i in range(0, len(batch), 256)])


def label_round(arm: Arm, target: int, setup: Setup) -> None:
    """Labels ``target - len(arm.pairs)`` more pairs chosen by the arm's suggester, with the oracle.

    What the Label tab does between two trainings (``ModelService.suggest_pair``): one ``suggest`` per
    label under the model and threshold of the last training, with the label graph of every answer so far
    (its labeled pairs excluded, its usage counted, its groups for ``join`` pairs).
    """
    embeddings = embed_pool(arm.model, setup.pixels)
    calibrated = arm.model is not setup.initial  # trained at least once: its threshold was calibrated
    graph = LabelGraph.from_pairs(arm.pairs)
    while len(arm.pairs) < target:
        s = arm.suggester.suggest(
            setup.pool, embeddings, arm.threshold, graph.labeled(), graph.usage(), setup.reference, graph, calibrated
        )
        if s is None:
            break
        same = setup.truth[s.image_a] == setup.truth[s.image_b]
        pair = LabeledPair(f"{arm.name}{len(arm.pairs)}", s.image_a, s.image_b, same)
        graph.add(pair)
        arm.pairs.append(pair)
        arm.kinds.append(s.kind)
        arm.similarities.append(s.similarity)


def round_config(pairs: list[LabeledPair], config: TrainConfig, min_steps: int) -> TrainConfig:
    """``config`` with enough epochs for ``min_steps`` optimizer steps over these labels and their implied pairs."""
    n_fit = len(pairs) + len(implied_pairs(pairs, max_count=int(config.implied_ratio * len(pairs)), seed=config.seed))
    steps_per_epoch = math.ceil(n_fit / config.batch_size)
    return replace(config, epochs=min(500, max(config.epochs, math.ceil(min_steps / steps_per_epoch))))


def train_round(
    base: ContrastiveSiameseNetwork, setup: Setup, pairs: list[LabeledPair], config: TrainConfig, min_steps: int
):
    """A copy of ``base`` trained on ``pairs``: (TrainResult, info), or (None, info) with too few labels."""
    config = round_config(pairs, config, min_steps)
    try:
        result = train_model(base, pairs, [], setup.digits.load_image, config)
    except TooFewLabels as error:
        return None, {"note": str(error)}
    info = {
        "epochs": result.metrics["epochs_run"],
        "steps": result.stats["steps"],
        "implied": result.metrics["n_implied_pairs"],
        "threshold": float(result.threshold),
        "seconds": result.stats["seconds"],
    }
    return result, info


def run_arm(arm: Arm, setup: Setup, schedule: list[int], config: TrainConfig, min_steps: int, warm: bool) -> None:
    started = time.perf_counter()
    for target in schedule:
        label_round(arm, target, setup)
        base = arm.model if warm else setup.initial
        result, info = train_round(base, setup, arm.pairs, config, min_steps)
        if result is not None:  # too few labels of one kind: the app keeps its model too
            arm.model, arm.threshold = result.model, info["threshold"]
        test = evaluate_model(arm.model, setup.test_pairs, setup.digits.load_image)  # best threshold on test
        at_own = evaluate_model(arm.model, setup.test_pairs, setup.digits.load_image, threshold=arm.threshold)
        auc = float(test["auc"])
        arm.curve.append((len(arm.pairs), auc))
        same = sum(p.same for p in arm.pairs)
        arm.rounds.append(
            {
                "labels": len(arm.pairs),
                "same": same,
                "auc": auc,
                **info,
                "threshold": arm.threshold,
                "test_accuracy_at_threshold": at_own["accuracy"],
                "test_best_threshold": test["threshold"],
                "test_best_accuracy": test["accuracy"],
                "kinds": dict(Counter(arm.kinds)),
            }
        )
        trained = (
            f"{info['epochs']:>3} epochs {info['steps']:>4} steps {info['seconds']:>4.0f} s"
            if result is not None
            else info["note"][:50]
        )
        trained += f"; thr {arm.threshold:+.2f} (test best {test['threshold']:+.2f})"
        print(
            f"seed {setup.seed} {arm.name:<10} {len(arm.pairs):>5} {same:>5} {auc:>8.4f}  {trained}",
            flush=True,
        )
    arm.seconds = time.perf_counter() - started


# ----------------------------------------------------------------------------- summary


def crossing(curve: list[tuple[float, float]], goal: float) -> tuple[float | None, str]:
    """Labels at which a curve first reaches ``goal``, linearly interpolated between schedule points."""
    previous = None
    for n, auc in curve:
        if auc >= goal:
            if previous is None or previous[1] >= goal:
                return float(n), f"at the schedule point {n}"
            (n0, a0) = previous
            at = n0 + (n - n0) * (goal - a0) / (auc - a0)
            return at, f"interpolated between {n0} and {n}"
        previous = (n, auc)
    return None, "never"


def mean_curves(results: list[dict[str, Arm]]) -> dict[str, list[tuple[int, float, float, float]]]:
    """Per arm: (labels, mean, min, max) of the test AUC over the seeds."""
    out = {}
    for name in ARMS:
        curves = np.array([[auc for _, auc in seed[name].curve] for seed in results])  # (seeds, points)
        labels = [n for n, _ in results[0][name].curve]
        out[name] = [
            (n, float(curves[:, j].mean()), float(curves[:, j].min()), float(curves[:, j].max()))
            for j, n in enumerate(labels)
        ]
    return out


def draw_plot(curves: dict, goal: float | None, path: Path, title: str, width: int = 760, height: int = 460) -> None:
    """Mean test AUC against labeled pairs per arm, with the min–max band over seeds; drawn with PIL."""
    image = Image.new("RGBA", (width, height), "white")
    draw = ImageDraw.Draw(image)
    left, right, top, bottom = 64, width - 24, 40, height - 48
    max_n = max(n for curve in curves.values() for n, *_ in curve)
    values = [v for curve in curves.values() for _, mean, lo, hi in curve for v in (mean, lo, hi)]
    low = max(0.0, math.floor(min(values) * 20) / 20)
    high = min(1.0, math.ceil(max(values) * 20) / 20)
    high = max(high, low + 0.05)

    def to_xy(n: float, auc: float) -> tuple[float, float]:
        x = left + (right - left) * n / max_n
        y = bottom - (bottom - top) * (auc - low) / (high - low)
        return x, y

    draw.text((left, 12), title, fill="black")
    for tick in np.arange(low, high + 1e-9, 0.05):
        _, y = to_xy(0, tick)
        draw.line([(left - 4, y), (right, y)], fill=(230, 230, 230))
        draw.text((left - 40, y - 6), f"{tick:.2f}", fill="black")
    draw.line([(left, top), (left, bottom), (right, bottom)], fill="black")
    for n in sorted({n for curve in curves.values() for n, *_ in curve}):
        x, _ = to_xy(n, low)
        draw.line([(x, bottom), (x, bottom + 4)], fill="black")
        draw.text((x - 10, bottom + 8), str(n), fill="black")
    draw.text(((left + right) // 2 - 40, height - 20), "labeled pairs", fill="black")
    for name, curve in curves.items():  # bands first, so every line stays visible
        band = Image.new("RGBA", image.size, (0, 0, 0, 0))
        outline = [to_xy(n, hi) for n, _, _, hi in curve] + [to_xy(n, lo) for n, _, lo, _ in reversed(curve)]
        ImageDraw.Draw(band).polygon(outline, fill=(*COLOURS.get(name, (0, 0, 0)), 50))
        image = Image.alpha_composite(image, band)
    draw = ImageDraw.Draw(image)
    if goal is not None:
        _, y = to_xy(0, goal)
        for x in range(left, right, 12):
            draw.line([(x, y), (x + 6, y)], fill=(120, 120, 120))
        draw.text((left + 8, y - 14), f"random @ {max_n}: {goal:.3f}", fill=(90, 90, 90))
    for i, (name, curve) in enumerate(curves.items()):
        colour = COLOURS.get(name, (0, 0, 0))
        points = [to_xy(n, mean) for n, mean, _, _ in curve]
        draw.line(points, fill=colour, width=3)
        for x, y in points:
            draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill=colour)
        ly = bottom - 60 + 18 * i
        draw.rectangle([right - 200, ly, right - 186, ly + 12], fill=colour)
        draw.text((right - 180, ly), f"{name} (mean, band min-max)", fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.convert("RGB").save(path)


def report(results: list[dict[str, Arm]], args, out: Path, docs: Path | None) -> None:
    curves = mean_curves(results)
    print(f"\n### Test AUC over {len(results)} seed(s): mean (min–max)")
    print("| labeled pairs | suggested | random | same pairs: suggested / random |")
    print("|---|---|---|---|")
    for j, ((n, sm, slo, shi), (_, rm, rlo, rhi)) in enumerate(zip(curves["suggested"], curves["random"], strict=True)):
        same_s = np.mean([r["suggested"].rounds[j]["same"] / n for r in results])
        same_r = np.mean([r["random"].rounds[j]["same"] / n for r in results])
        print(
            f"| {n:,} | {sm:.3f} ({slo:.3f}–{shi:.3f}) | {rm:.3f} ({rlo:.3f}–{rhi:.3f}) | {same_s:.0%} / {same_r:.0%} |"
        )
    print("\nsuggested arm, share of 'same' among each kind's picks per round, all seeds (picks in brackets):")
    labels = [n for n, *_ in curves["suggested"]]
    spans = list(zip([0, *labels[:-1]], labels, strict=True))
    print("| kind | " + " | ".join(f"{a}→{b}" for a, b in spans) + " |")
    print("|---" * (len(spans) + 1) + "|")
    for kind in ("join", "merge", "hard_positive", "hard_negative", "uncertain", "random"):
        cells = []
        for a, b in spans:
            picked = [
                p.same
                for r in results
                for p, k in zip(r["suggested"].pairs[a:b], r["suggested"].kinds[a:b], strict=True)
                if k == kind
            ]
            cells.append(f"{np.mean(picked):.0%} ({len(picked)})" if picked else "-")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    for seed, r in zip(args.seed_list, results, strict=True):
        n_last, goal_seed = r["random"].curve[-1]
        at, how = crossing(r["suggested"].curve, goal_seed)
        said = f"{at:.0f} labels ({how})" if at is not None else "never reached"
        print(
            f"seed {seed}: random reaches {goal_seed:.4f} at {n_last}; suggested: {said}; "
            f"time suggested {r['suggested'].seconds:.0f} s, random {r['random'].seconds:.0f} s"
        )

    random_mean = [(n, m) for n, m, _, _ in curves["random"]]
    for n, m, _, _ in curves["suggested"]:
        at, how = crossing(random_mean, m)
        said = f"{at:.0f} labels ({how}; {at / n:.1f}x)" if at is not None else f"more than {random_mean[-1][0]}"
        print(f"random pairs need for suggested's mean AUC at {n} ({m:.3f}): {said}")

    budget = curves["random"][-1][0]
    goal = curves["random"][-1][1]
    at, how = crossing([(n, m) for n, m, _, _ in curves["suggested"]], goal)
    if at is None:
        best = max(m for _, m, _, _ in curves["suggested"])
        print(
            f"goal missed: suggestions never reached random's mean AUC {goal:.4f} at {budget} labels (best {best:.4f})"
        )
    else:
        verdict = "met" if at <= budget / 2 else "missed"
        print(
            f"suggestions reach random's mean AUC at {budget} labels ({goal:.4f}) with {at:.0f} labels ({how}; "
            f"{at / budget:.0%}); goal (≤ 50%) {verdict}"
        )
    start = "from the initial weights" if args.fresh else "continuing the last model"
    title = f"Test ROC AUC vs labeled pairs (digits, small_cnn; each round {start}; {len(results)} seed(s))"
    for path in [out, docs]:
        if path is not None:
            draw_plot(curves, goal, path, title)
            print(f"plot: {path}")


def save_json(results: list[dict[str, Arm]], args, path: Path) -> None:
    """Every arm's labeled pairs (with their kinds) and rounds, for later analysis."""
    data = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "seeds": [
            {
                name: {
                    "pairs": [
                        [p.image_a, p.image_b, p.same, k, round(sim, 4)]
                        for p, k, sim in zip(arm.pairs, arm.kinds, arm.similarities, strict=True)
                    ],
                    "rounds": arm.rounds,
                    "seconds": arm.seconds,
                }
                for name, arm in r.items()
            }
            for r in results
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def load_json(path: Path) -> tuple[list[dict[str, Arm]], list[int], bool]:
    """The arms of a saved run (curves, rounds, pairs and kinds; no models): (results, seeds, fresh)."""
    data = json.loads(path.read_text())
    results = []
    for saved in data["seeds"]:
        arms = {}
        for name, arm in saved.items():
            pairs = [LabeledPair(f"{name}{i}", a, b, same) for i, (a, b, same, *_) in enumerate(arm["pairs"])]
            arms[name] = Arm(
                name,
                suggester=None,
                model=None,
                pairs=pairs,
                kinds=[row[3] for row in arm["pairs"]],
                similarities=[row[4] if len(row) > 4 else math.nan for row in arm["pairs"]],
                curve=[(r["labels"], r["auc"]) for r in arm["rounds"]],
                rounds=arm["rounds"],
                seconds=arm["seconds"],
            )
        results.append(arms)
    return results, json.loads(data["args"]["seed_list"]), data["args"].get("fresh") == "True"


def epoch_check(digits: Digits, args, config: TrainConfig, schedule: list[int]) -> None:
    """The random arm trained with the schedule and with twice the schedule (epochs and steps), side by side."""
    double = replace(config, epochs=2 * config.epochs)
    print(
        f"epoch check, random arm ({'fresh' if args.fresh else 'warm'}): {config.epochs} epochs and {args.steps} "
        f"steps at least per round, against {double.epochs} and {2 * args.steps}"
    )
    for seed in args.seed_list:
        setup = make_setup(digits, seed, args.pool, args.test_pairs)
        arms = [Arm("random", Suggester(seed=seed, random_share=1.0), setup.initial) for _ in range(2)]
        run_arm(arms[0], setup, schedule, replace(config, seed=seed), args.steps, not args.fresh)
        run_arm(arms[1], setup, schedule, replace(double, seed=seed), 2 * args.steps, not args.fresh)
        print("| seed | labels | steps | test AUC | 2× steps | 2× test AUC | difference |")
        print("|---|---|---|---|---|---|---|")
        for one, two in zip(arms[0].rounds, arms[1].rounds, strict=True):
            print(
                f"| {seed} | {one['labels']} | {one.get('steps', '-')} | {one['auc']:.4f} | {two.get('steps', '-')} | "
                f"{two['auc']:.4f} | {two['auc'] - one['auc']:+.4f} |",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 → 200 labels, 600-image pool, short training")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2; quick: 0)")
    parser.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    parser.add_argument("--schedule", default=None, help="label counts (default 50,100,200,300,500,1000)")
    parser.add_argument("--pool", type=int, default=None, help="pool images (default 1300; the rest are test)")
    parser.add_argument("--test-pairs", type=int, default=None, help="held-out test pairs (default 2000)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per round at least (TrainConfig: 20)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per round at least (default 200)")
    parser.add_argument("--fresh", action="store_true", help="each round trains the initial weights (default: warm)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--arms", default=",".join(ARMS), help="run only these arms (a probe: no report)")
    parser.add_argument("--join-share", type=float, default=None, help="Suggester join_share (default: its own)")
    parser.add_argument(
        "--implied-ratio", type=float, default=None, help="TrainConfig implied_ratio (default: its own)"
    )
    parser.add_argument("--epoch-check", action="store_true", help="only the random arm, with the schedule and 2×")
    parser.add_argument("--out", type=Path, default=RESULTS / "active.png")
    parser.add_argument("--docs", type=Path, default=None, help="also save the plot here (docs/active.png)")
    parser.add_argument(
        "--from-json", type=Path, nargs="+", default=None, help="report saved runs (active.json files) as one"
    )
    parser.add_argument("--json", type=Path, default=None, help="pairs and rounds (default results/active.json)")
    args = parser.parse_args(argv)
    quick = args.quick
    seeds = (
        [args.seed]
        if args.seed is not None
        else [int(s) for s in (args.seeds or ("0" if quick else "0,1,2")).split(",")]
    )
    schedule = [int(s) for s in (args.schedule or ("50,100,200" if quick else "50,100,200,300,500,1000")).split(",")]
    args.pool = args.pool or (600 if quick else 1300)
    args.test_pairs = args.test_pairs or (500 if quick else 2000)
    args.epochs = args.epochs or (3 if quick else TrainConfig().epochs)
    args.steps = args.steps if args.steps is not None else (25 if quick else 200)
    args.seed_list = seeds
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    digits = load_digits_images()
    config = TrainConfig(epochs=args.epochs)  # every other setting the product's default
    if args.implied_ratio is not None:
        config = replace(config, implied_ratio=args.implied_ratio)
    tuning = {} if args.join_share is None else {"join_share": args.join_share}
    if args.from_json:  # the table, verdict and plot of a saved run, without training
        by_seed: dict[int, dict[str, Arm]] = {}
        for path in args.from_json:  # runs of other seeds or arms (in parallel processes) report as one
            found, seeds, args.fresh = load_json(path)
            for seed, arms in zip(seeds, found, strict=True):
                by_seed.setdefault(seed, {}).update({name: arm for name, arm in arms.items() if arm.rounds})
        missing = [f"seed {seed}: {name}" for seed, arms in by_seed.items() for name in ARMS if name not in arms]
        if missing:
            parser.error(f"no rounds saved for {', '.join(missing)}")
        args.seed_list, results = list(by_seed), list(by_seed.values())
        report(results, args, args.out, args.docs)
        if len(args.from_json) > 1 and args.json:
            save_json(results, args, args.json)
        return 0
    if args.epoch_check:
        epoch_check(digits, args, config, schedule)
        print(f"total {time.perf_counter() - started:.0f} s")
        return 0

    print(
        f"pool {args.pool} images, {args.test_pairs} test pairs over the other {len(digits) - args.pool}; "
        f"seeds {seeds}; schedule {schedule}; TrainConfig defaults, epochs ≥ {args.epochs}, steps ≥ {args.steps}; "
        f"{args.threads} thread(s)"
    )
    print(f"{'seed':<6} {'arm':<10} {'labels':>5} {'same':>5} {'test AUC':>8}  training")
    results = []
    for seed in seeds:
        setup = make_setup(digits, seed, args.pool, args.test_pairs)
        seed_config = replace(config, seed=seed)
        arms = {
            "suggested": Arm("suggested", Suggester(seed=seed, random_share=0.2, **tuning), setup.initial),
            "random": Arm("random", Suggester(seed=seed, random_share=1.0), setup.initial),
        }
        for name in args.arms.split(","):
            run_arm(arms[name], setup, schedule, seed_config, args.steps, not args.fresh)
        results.append(arms)
    if args.arms != ",".join(ARMS):
        save_json(results, args, args.json or args.out.with_suffix(".json"))
        print(f"total {time.perf_counter() - started:.0f} s (arms {args.arms}: no comparison)")
        return 0
    report(results, args, args.out, args.docs)
    save_json(results, args, args.json or args.out.with_suffix(".json"))
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
