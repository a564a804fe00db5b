"""Running the active model's forward pass for scoring: PyTorch, or ONNX Runtime in fp32 or int8.

Training and explanations need autograd and stay in PyTorch. Scoring needs only ``model.embed``, which
ONNX Runtime runs faster on a CPU (batch norm folded into the convolutions, its own kernels and thread
pool), and much faster once the convolutions are quantized to int8 (AVX-512 VNNI). Quantization moves
the embeddings, so an int8 engine is only used after :func:`verify_int8` has shown that it keeps the
validation AUC within :data:`MAX_AUC_DROP` of fp32 on the user's own labeled pairs.

The ONNX files are derived data, written once per checkpoint (keyed by the weights' SHA-256) under
``data_dir/runtime`` and rebuilt whenever they are missing or unreadable. The app builds them in a child
process (``python -m siamese.runtime export|quantize``): the exporter and the quantizer need several
hundred MB at their peak, which would otherwise stay in the serving process's footprint for good.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import logging
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .metrics import roc_auc
from .model import ContrastiveSiameseNetwork
from .store import write_atomically

log = logging.getLogger(__name__)

MAX_AUC_DROP = 0.005  # the most validation AUC an int8 engine may cost
MIN_VERIFY_PAIRS = 20  # labeled validation pairs (both kinds present) needed to verify int8
CALIBRATION_IMAGES = 64

Run = Callable[[torch.Tensor], torch.Tensor]


class _ExitGate:
    """Counts ONNX Runtime calls in flight; at interpreter exit waits for them and admits no more.

    The service runs ONNX Runtime in daemon threads (engine building, the pool warm-up). If the process
    exits while one of them is inside a session, tearing down ONNX Runtime's thread pool aborts the process
    ("terminate called without an active exception"). After :meth:`close`, new calls block forever: daemon
    threads are stopped by the exit anyway.
    """

    def __init__(self):
        self._cond = threading.Condition()
        self._running = 0
        self._closed = False

    def __enter__(self) -> None:
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._running += 1

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def close(self, timeout: float = 20.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._running == 0, timeout)


_GATE = _ExitGate()
atexit.register(_GATE.close)


class RuntimeUnavailable(RuntimeError):
    """ONNX Runtime (or the ONNX exporter) is not installed or cannot handle this model."""


@dataclass(frozen=True)
class Engine:
    """How embeddings are computed: a callable (N, 3, H, W) -> (N, D), and what it is, for the UI."""

    run: Run
    runtime: str  # "torch" or "onnx"
    precision: str  # "fp32" or "int8"
    note: str = ""
    path: Path | None = None  # the ONNX file, for an ONNX Runtime engine

    @property
    def tag(self) -> str:
        """Part of the embedding-cache key: engines whose embeddings differ must not share entries."""
        return "" if self.precision == "fp32" else f"@{self.precision}"

    def describe(self) -> dict:
        return {"runtime": self.runtime, "precision": self.precision, "note": self.note}


def torch_engine(model: ContrastiveSiameseNetwork, note: str = "") -> Engine:
    def run(batch: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model.embed(batch.contiguous(memory_format=torch.channels_last)).float().cpu()

    return Engine(run, "torch", "fp32", note)


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class _Embed(torch.nn.Module):
    def __init__(self, model: ContrastiveSiameseNetwork):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.embed(images)


def export_onnx(model: ContrastiveSiameseNetwork, path: Path) -> Path:
    """Writes ``model.embed`` as an ONNX graph with a dynamic batch dimension (input ``images``)."""
    size = model.preprocessing.crop_size
    example = torch.randn(2, 3, size, size)
    module = _Embed(model).eval().cpu()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (example,),
                dynamo=True,
                verbose=False,
                input_names=["images"],
                output_names=["embeddings"],
                dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
            )
    except ImportError as error:  # onnx / onnxscript missing
        raise RuntimeUnavailable(f"the ONNX exporter is not installed ({error})") from error
    if program is None:
        raise RuntimeUnavailable("torch.onnx.export returned no program")
    with tempfile.TemporaryDirectory() as tmp:
        program.save(str(Path(tmp) / "model.onnx"))
        write_atomically(path, (Path(tmp) / "model.onnx").read_bytes())
    return path


def quantize_int8(fp32_path: Path, path: Path, calibration: torch.Tensor, batch_size: int = 8) -> Path:
    """Static int8 quantization (QDQ, per-channel weights, uint8 activations) calibrated on real images.

    ``calibration``: preprocessed (N, 3, H, W) images from the pool; activation ranges come from them.
    """
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if len(calibration) == 0:
        raise ValueError("int8 calibration needs at least one image")
    batches = [calibration[i : i + batch_size].contiguous().numpy() for i in range(0, len(calibration), batch_size)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._batches = iter(batches)

        def get_next(self):
            batch = next(self._batches, None)
            return None if batch is None else {"images": batch}

    with _GATE, tempfile.TemporaryDirectory() as tmp:
        prepared, quantized = Path(tmp) / "prepared.onnx", Path(tmp) / "int8.onnx"
        quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(quantized),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )
        write_atomically(path, quantized.read_bytes())
    return path


def onnx_engine(path: Path, precision: str, threads: int | None = None, note: str = "") -> Engine:
    """An ONNX Runtime session on the CPU; ``run`` is thread-safe (ORT sessions are)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False  # the arena keeps its high-water mark resident for good
    # Idle workers sleep instead of spinning: a spinning pool starves a training job (and neighbours on a
    # shared CPU); measured here with one core busy, a pair's forward took 128 ms without spinning, 172 with.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(batch: torch.Tensor) -> torch.Tensor:
        with _GATE:  # all of it: torch's and ORT's C++ frames must not be on the stack at exit
            array = np.ascontiguousarray(batch.detach().cpu().numpy(), dtype=np.float32)
            return torch.from_numpy(session.run(None, {"images": array})[0])

    return Engine(run, "onnx", precision, note, Path(path))


def weights_digest(weights_file: Path) -> str:
    digest = hashlib.sha256()
    with open(weights_file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _cached(path: Path, build: Callable[[Path], Path]) -> Path:
    if path.is_file() and path.stat().st_size > 0:
        return path
    return build(path)


def _child(*args: str, timeout: float = 900) -> None:
    """Runs ``python -m siamese.runtime ARGS``; RuntimeUnavailable with its last words if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "siamese.runtime", *args], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeUnavailable(f"{args[0]} exited with {done.returncode}: {lines[-1] if lines else 'no output'}")


def fp32_onnx(checkpoint_dir: Path, cache_dir: Path, key: str) -> Path:
    """The fp32 ONNX file of a saved checkpoint, exported in a child process when not cached."""
    return _cached(cache_dir / f"{key}.fp32.onnx", lambda p: _child("export", str(checkpoint_dir), str(p)) or p)


def int8_onnx(fp32_path: Path, cache_dir: Path, key: str, calibration: torch.Tensor) -> Path:
    """The int8 ONNX file, quantized in a child process (calibration images passed as a .npy) when not cached."""

    def build(path: Path) -> Path:
        with tempfile.TemporaryDirectory() as tmp:
            images = Path(tmp) / "calibration.npy"
            np.save(images, calibration.contiguous().numpy(), allow_pickle=False)
            _child("quantize", str(fp32_path), str(images), str(path))
        return path

    return _cached(cache_dir / f"{key}.int8.onnx", build)


@dataclass(frozen=True)
class Verification:
    """fp32 against int8 on labeled validation pairs."""

    passed: bool
    pairs: int
    auc_fp32: float | None
    auc_int8: float | None
    reason: str

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "pairs": self.pairs,
            "auc_fp32": self.auc_fp32,
            "auc_int8": self.auc_int8,
            "reason": self.reason,
        }


def _pair_similarities(run: Run, images: torch.Tensor, index_a: Sequence[int], index_b: Sequence[int]) -> np.ndarray:
    embeddings = torch.cat([run(images[i : i + 32]) for i in range(0, len(images), 32)]).double()
    return (embeddings[list(index_a)] * embeddings[list(index_b)]).sum(1).numpy()


def too_few_to_verify(labels: Sequence[bool]) -> str | None:
    """Why these validation labels cannot check an int8 engine, or None when they can."""
    if len(labels) >= MIN_VERIFY_PAIRS and any(labels) and not all(labels):
        return None
    return (
        f"int8 needs at least {MIN_VERIFY_PAIRS} labeled validation pairs, both same and different, "
        f"to be checked against fp32 (there are {len(labels)}); serving fp32 until a model is activated "
        "with enough of them"
    )


def verify_int8(
    fp32: Run,
    int8: Run,
    images: torch.Tensor,
    pairs: Sequence[tuple[int, int, bool]],
    max_drop: float = MAX_AUC_DROP,
) -> Verification:
    """Whether ``int8`` keeps the validation AUC of ``fp32`` within ``max_drop``.

    ``images``: preprocessed (N, 3, H, W) validation images; ``pairs``: (index a, index b, same) into them.
    """
    same = [p[2] for p in pairs]
    missing = too_few_to_verify(same)
    if missing:
        return Verification(False, len(pairs), None, None, missing)
    index_a, index_b = [p[0] for p in pairs], [p[1] for p in pairs]
    auc_fp32 = roc_auc(_pair_similarities(fp32, images, index_a, index_b), same)
    auc_int8 = roc_auc(_pair_similarities(int8, images, index_a, index_b), same)
    drop = auc_fp32 - auc_int8
    passed = drop <= max_drop
    verdict = "within" if passed else "beyond"
    reason = (
        f"validation AUC over {len(pairs)} pairs: fp32 {auc_fp32:.4f}, int8 {auc_int8:.4f} "
        f"(drop {drop:+.4f}, {verdict} the {max_drop} allowed)"
    )
    return Verification(passed, len(pairs), auc_fp32, auc_int8, reason)


def main(argv: Sequence[str] | None = None) -> int:
    """``export CHECKPOINT_DIR OUT.onnx`` or ``quantize FP32.onnx CALIBRATION.npy OUT.onnx`` (the app's children)."""
    from .checkpoint import load_checkpoint

    parser = argparse.ArgumentParser(prog="python -m siamese.runtime", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="a checkpoint's model.embed to ONNX (fp32)")
    export.add_argument("checkpoint", type=Path)
    export.add_argument("out", type=Path)
    quantize = commands.add_parser("quantize", help="fp32 ONNX to static int8, calibrated on images")
    quantize.add_argument("onnx", type=Path)
    quantize.add_argument("calibration", type=Path, help="(N, 3, H, W) float32 preprocessed images, .npy")
    quantize.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.command == "export":
        model, _ = load_checkpoint(args.checkpoint)
        export_onnx(model.eval(), args.out)
    else:
        images = torch.from_numpy(np.load(args.calibration, allow_pickle=False))
        quantize_int8(args.onnx, args.out, images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
