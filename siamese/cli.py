"""The ``siamese`` command line: train, evaluate, export, import.

``torchrun --nproc_per_node N -m siamese train …`` trains with DistributedDataParallel; every rank
reads the same data, rank 0 writes the new version.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .config import add_settings_arguments, settings_from_args


def _train_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=int, help="passes over the pairs (default: TrainConfig's)")
    parser.add_argument("--learning-rate", type=float, help="peak AdamW learning rate")
    parser.add_argument("--margin", type=float, help="contrastive margin, in (0, 2]")
    parser.add_argument("--batch-size", type=int, help="pairs per step")
    parser.add_argument("--mode", choices=["auto", "head", "full"], help="what to train (default auto)")
    parser.add_argument("--seed", type=int, help="random seed (shuffling, augmentation)")


def _data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", required=True, help="an export zip or folder, or class folders (zip or folder: class/image.jpg)"
    )
    parser.add_argument("--pairs-per-class", type=int, help="class folders: 'same' pairs per class")
    parser.add_argument("--n-pairs", type=int, help="class folders: total pairs to generate (half same)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="siamese", description="Learn what similar means for your images.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="fine-tune the active model on a dataset; writes a new version")
    _data_options(train)
    _train_options(train)
    train.add_argument("--no-activate", action="store_true", help="save the new version without activating it")
    add_settings_arguments(train)

    evaluate = commands.add_parser("evaluate", help="pair metrics of a model on a dataset")
    _data_options(evaluate)
    evaluate.add_argument("--model", help="a version (v3) or a .safetensors file (default: the active version)")
    add_settings_arguments(evaluate)

    export = commands.add_parser("export", help="write every image and label to a zip")
    export.add_argument("out", help="the zip to write")
    add_settings_arguments(export)

    imports = commands.add_parser("import", help="add an export zip or class folders to the label store")
    imports.add_argument("path", help="a zip or folder")
    imports.add_argument("--pairs-per-class", type=int)
    imports.add_argument("--n-pairs", type=int)
    add_settings_arguments(imports)
    return parser


def _load_dataset(args: argparse.Namespace, scratch: Path):
    """Reads ``--data`` into a scratch store (the app's own labels are not touched)."""
    from .store import PairStore
    from .transfer import import_path

    store = PairStore(scratch)
    report = import_path(store, Path(args.data), pairs_per_class=args.pairs_per_class, n_pairs=args.n_pairs)
    if report.rejected:
        print(f"{len(report.rejected)} entries rejected, e.g. {report.rejected[0]}", file=sys.stderr)
    return store


def _pairs(store, split: str):
    from .train import LabeledPair

    return [LabeledPair.from_label(p.pair_id, p.image_a, p.image_b, p.label) for p in store.pairs_for_split(split)]


def _loader(store):
    from .images import decode_bytes

    return lambda digest: decode_bytes(store.image_bytes(digest))


class _ProgressBar:
    """A tqdm bar fed by the trainer's progress reports (rank 0 only)."""

    def __init__(self, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=1000, unit="‰", disable=not enabled, dynamic_ncols=True)

    def __call__(self, info: dict) -> None:
        self.bar.n = int(1000 * float(info.get("progress", 0.0)))
        postfix = {"epoch": info.get("epoch"), "loss": info.get("loss")}
        if info.get("metrics"):
            postfix["val_auc"] = info["metrics"].get("auc")
        self.bar.set_postfix({k: v for k, v in postfix.items() if v is not None}, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _distributed() -> tuple[int, int]:
    """(rank, world size); initializes the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return dist.get_rank(), dist.get_world_size()


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from .service import ensure_active_version, pairs_hash
    from .train import TrainConfig, train_model
    from .versions import ModelRegistry

    settings = settings_from_args(args)
    rank, world = _distributed()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu")
    config = TrainConfig().with_options(
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        margin=args.margin,
        batch_size=args.batch_size,
        mode=args.mode,
        seed=args.seed,
    )
    registry = ModelRegistry(Path(settings.data_dir) / "models")
    if rank == 0:
        ensure_active_version(registry, settings)
    if world > 1:
        torch.distributed.barrier()  # v0 exists before the other ranks read it
    base_version = registry.active()
    base, base_meta = registry.load(base_version, device=device)
    with tempfile.TemporaryDirectory(prefix="siamese-cli-") as scratch:
        store = _load_dataset(args, Path(scratch))
        train_pairs, val_pairs = _pairs(store, "train"), _pairs(store, "val")
        if rank == 0:
            print(f"training {base_version} ({base_meta.get('backbone')}) on {len(train_pairs)} pairs, "
                  f"validating on {len(val_pairs)}, {world} process(es)", file=sys.stderr)  # fmt: skip
        bar = _ProgressBar(enabled=rank == 0)
        try:
            result = train_model(
                base, train_pairs, val_pairs, _loader(store), config, on_progress=bar, device=device,
                base_threshold=float(base_meta.get("threshold", 0.5)),
            )  # fmt: skip
        finally:
            bar.close()
    if world > 1:  # every rank's weights, so a user (and the tests) can see they agree
        print(f"rank {rank}/{world}: weights sha256={weights_fingerprint(result.model)}", file=sys.stderr)
    if rank != 0:
        return 0
    from .checkpoint import model_metadata

    meta = model_metadata(
        result.model,
        threshold=result.threshold,
        metrics=result.metrics,
        parent=base_version,
        train_pairs_hash=pairs_hash(train_pairs),
        train_config=config.to_dict(),
        mode=result.mode,
        history=result.history,
        comparison=result.comparison,
        world_size=world,
    )
    info = registry.save(result.model, meta)
    if not args.no_activate:
        registry.set_active(info.version)
    print(
        json.dumps({"model_version": info.version, "active": not args.no_activate, "metrics": _brief(result.metrics)})
    )
    return 0


def weights_fingerprint(model) -> str:
    """SHA-256 over every tensor of the state dict, in name order."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _brief(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k != "histograms"}


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .checkpoint import load_checkpoint
    from .service import ensure_active_version
    from .train import evaluate_model
    from .versions import ModelRegistry

    settings = settings_from_args(args)
    registry = ModelRegistry(Path(settings.data_dir) / "models")
    if args.model and args.model.endswith(".safetensors"):
        model, meta = load_checkpoint(Path(args.model))
    else:
        model, meta = registry.load(args.model or ensure_active_version(registry, settings))
    with tempfile.TemporaryDirectory(prefix="siamese-cli-") as scratch:
        store = _load_dataset(args, Path(scratch))
        pairs = _pairs(store, "train") + _pairs(store, "val") + _pairs(store, "cross")
        metrics = evaluate_model(model, pairs, _loader(store), threshold=meta.get("threshold"))
    print(json.dumps({"model_version": meta.get("version"), **_brief(metrics)}, indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .store import PairStore
    from .transfer import export_zip

    settings = settings_from_args(args)
    out = export_zip(PairStore(settings.data_dir), Path(args.out))
    print(out)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from .store import PairStore
    from .transfer import import_path

    settings = settings_from_args(args)
    report = import_path(
        PairStore(settings.data_dir), Path(args.path), pairs_per_class=args.pairs_per_class, n_pairs=args.n_pairs
    )
    print(json.dumps(report.to_dict(), indent=2))
    return 0


COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "export": cmd_export, "import": cmd_import}


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, LookupError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
