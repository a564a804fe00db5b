"""The whole benchmark suite in one command, one table at the end.

Runs benchmarks/bench_serve.py (in this process) and, each in its own process with its quick or small
options, bench_store.py (``--pairs 2000``), bench_train.py (``--quick --only speed``) and
bench_active.py (``--quick``); their own output goes to a log file per benchmark, and their headline
lines join one table.

    python benchmarks/run_all.py                    # about 6 minutes on 2 CPU cores
    python benchmarks/run_all.py --skip active,http # leave parts out
    python benchmarks/run_all.py --full             # bench_serve's full repeats
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.bench_serve import SECTIONS, Row, print_table, run  # noqa: E402

OTHERS = {
    "store": ["bench_store.py", "--pairs", "2000", "--repeats", "100"],
    "digits": ["bench_train.py", "--quick", "--only", "speed"],
    "active": ["bench_active.py", "--quick"],
}


def _run_script(name: str, logs: Path, extra: tuple[str, ...] = ()) -> tuple[str, float]:
    script, *args = OTHERS[name]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(HERE / script), *args, *extra], capture_output=True, text=True, cwd=HERE.parent
    )
    output = done.stdout + done.stderr
    (logs / f"{name}.log").write_text(output)
    if done.returncode != 0:
        raise RuntimeError(f"{script} exited with {done.returncode}; see {logs / f'{name}.log'}:\n{output[-2000:]}")
    return output, time.perf_counter() - started


def store_rows(output: str) -> list[Row]:
    """bench_store's table: operation | median | p95 | target | ok | JSON-file median | ratio."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 7 and re.fullmatch(r"[\d.]+", cells[1]):
            name, median, p95, target, ok, reference, ratio = cells
            rows.append(
                Row(
                    f"store, 2,000 pairs: {name}",
                    f"{median} ms (p95 {p95})",
                    f"{reference} ms (JSON file)",
                    ratio,
                    f"<= {target} ms",
                    "yes" if ok == "yes" else "NO",
                )
            )
    return rows


def train_rows(output: str) -> list[Row]:
    """bench_train's speed table: | measurement | value |."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("measurement", "---") and not set(cells[0]) <= {"-"}:
            rows.append(Row(f"bench_train (small_cnn / cached resnet18 features): {cells[0]}", cells[1]))
    return rows


def active_rows(output: str) -> list[Row]:
    """bench_active's verdict line."""
    for line in output.splitlines():
        if line.startswith(("suggestions reach", "goal missed")):
            met = "yes" if line.endswith(" met") else "NO"
            return [Row("active learning (digits, quick): suggested vs random labels", line, target="<= 50%", met=met)]
    return []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = (*SECTIONS, *OTHERS)
    parser.add_argument("--skip", default="", help=f"comma-separated parts to leave out, of {', '.join(parts)}")
    parser.add_argument("--full", action="store_true", help="bench_serve's full repeats (the others stay quick)")
    parser.add_argument("--logs", type=Path, default=None, help="where each benchmark's output goes (a temp dir)")
    args = parser.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(parts):
        parser.error(f"unknown part(s) {', '.join(sorted(skip - set(parts)))}; choose from {', '.join(parts)}")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="siamese-bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; logs in {logs}", flush=True)

    started = time.perf_counter()
    rows: list[Row] = []
    sections = tuple(s for s in SECTIONS if s not in skip)
    if sections:
        print(f"bench_serve: {', '.join(sections)} ...", flush=True)
        rows += run(sections, quick=not args.full)
    parsers = {"store": store_rows, "digits": train_rows, "active": active_rows}
    for name, parse in parsers.items():
        if name in skip:
            continue
        print(f"{OTHERS[name][0]} ...", flush=True)
        extra = ("--out", str(logs / "active.png")) if name == "active" else ()
        output, seconds = _run_script(name, logs, extra)
        found = parse(output)
        rows += found or [Row(f"{OTHERS[name][0]}: no table found", f"see {logs / f'{name}.log'}")]
        print(f"  {seconds:.0f} s", flush=True)
    print_table(rows, f"siamese benchmarks ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
