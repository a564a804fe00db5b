"""The command line, run as a user runs it: ``python -m siamese …`` in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.images_factory import shapes_dataset

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, data_dir: Path, extra_env: dict | None = None, module=("-m", "siamese"), timeout=300):
    env = {**os.environ, "SIAMESE_DATA_DIR": str(data_dir), "SIAMESE_BACKBONE": "small_cnn", "SIAMESE_PRETRAINED": "0"}
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, *module, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def class_zip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "shapes.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i, (name, data) in enumerate(shapes_dataset(per_class=14)):
            archive.writestr(f"{name}/{i}.png", data)
    return path


def test_help_lists_commands(tmp_path):
    result = run_cli("--help", data_dir=tmp_path)
    assert result.returncode == 0
    for command in ("train", "evaluate", "export", "import"):
        assert command in result.stdout


def test_bad_data_path_is_a_clear_error(tmp_path):
    result = run_cli("train", "--data", tmp_path / "missing.zip", "--epochs", "1", data_dir=tmp_path / "d")
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_train_writes_a_new_active_version_then_evaluate(tmp_path, class_zip):
    data = tmp_path / "data"
    result = run_cli("train", "--data", class_zip, "--epochs", "3", "--n-pairs", "80", data_dir=data)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["model_version"] == "v1" and summary["active"] is True
    assert (data / "models" / "ACTIVE").read_text().strip() == "v1"
    meta = json.loads((data / "models" / "v1" / "meta.json").read_text())
    assert meta["parent"] == "v0" and meta["backbone"] == "small_cnn"
    assert "%" in result.stderr or "‰" in result.stderr  # the progress bar

    evaluated = run_cli("evaluate", "--data", class_zip, "--n-pairs", "80", data_dir=data)
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout)
    assert metrics["model_version"] == "v1"
    assert 0.0 <= metrics["auc"] <= 1.0 and metrics["n_pairs"] > 0


def test_import_then_export_round_trip(tmp_path, class_zip):
    data = tmp_path / "data"
    imported = run_cli("import", class_zip, "--n-pairs", "30", data_dir=data)
    assert imported.returncode == 0, imported.stderr
    report = json.loads(imported.stdout)
    assert report["images_added"] == 28 and report["pairs_added"] == 30
    out = tmp_path / "out.zip"
    exported = run_cli("export", out, data_dir=data)
    assert exported.returncode == 0, exported.stderr
    with zipfile.ZipFile(out) as archive:
        names = archive.namelist()
        rows = archive.read("pairs.csv").decode().strip().splitlines()
    assert sum(n.startswith("images/") for n in names) == 28
    assert len(rows) == 1 + 30


def state_fingerprint(state: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.slow
def test_torchrun_two_processes_end_with_identical_weights(tmp_path, class_zip):
    data = tmp_path / "data"
    result = run_cli(
        "--standalone", "--nproc_per_node", "2", "-m", "siamese", "train",
        "--data", class_zip, "--epochs", "2", "--n-pairs", "60", "--mode", "full",
        data_dir=data, module=("-m", "torch.distributed.run"), extra_env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    prints = dict(re.findall(r"rank (\d)/2: weights sha256=([0-9a-f]{64})", result.stderr))
    assert set(prints) == {"0", "1"}, result.stderr[-3000:]
    assert prints["0"] == prints["1"]
    saved = load_file(data / "models" / "v1" / "model.safetensors")
    assert state_fingerprint(saved) == prints["0"]
    assert (data / "models" / "ACTIVE").read_text().strip() == "v1"
    meta = json.loads((data / "models" / "v1" / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["parent"] == "v0"
