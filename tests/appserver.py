"""Launches the real app (``python app.py``) in a subprocess, for tests that drive it from outside.

The app runs exactly as a user starts it, with a small CPU model and a temporary data directory:
``SIAMESE_BACKBONE=small_cnn``, ``SIAMESE_PRETRAINED=0``, Gradio's own ``GRADIO_SERVER_*`` variables
for the address. :func:`run_app` yields once the server answers HTTP and stops it afterwards, so any
test module can use it as a fixture::

    @pytest.fixture(scope="module")
    def app(tmp_path_factory):
        with run_app(tmp_path_factory.mktemp("data")) as server:
            yield server
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class AppServer:
    """A running app: its URL, data directory and log file."""

    url: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/config", timeout=2) as response:
            return response.status == 200
    except urllib.error.HTTPError as error:
        return error.code in (401, 403)  # with SIAMESE_AUTH the server answers, behind a login
    except (OSError, urllib.error.URLError):
        return False


def _stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)  # lets Gradio close its server cleanly
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace)


@contextlib.contextmanager
def run_app(
    data_dir: Path,
    env: Mapping[str, str] | None = None,
    args: tuple[str, ...] = (),
    timeout: float = 90.0,
    script: Path = REPO / "app.py",
) -> Iterator[AppServer]:
    """Runs ``python app.py`` on a free port with ``data_dir`` until the block exits.

    Args:
        data_dir: becomes ``SIAMESE_DATA_DIR``; the log is written next to it.
        env: extra environment variables (e.g. ``{"SIAMESE_AUTH": "ann:pw"}``), applied last.
        args: extra command-line flags for ``app.py``.
        timeout: seconds to wait for the server to answer.
        script: what to run instead of ``app.py`` (a variant of the app).

    Raises:
        RuntimeError: the app exited or did not answer in time; the message holds its log.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = data_dir.parent / f"{data_dir.name}-app.log"
    child_env = {
        **os.environ,
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "SIAMESE_DATA_DIR": str(data_dir),
        "SIAMESE_BACKBONE": "small_cnn",
        "SIAMESE_PRETRAINED": "0",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=REPO,
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = AppServer(url=url, data_dir=data_dir, log_path=log_path, process=process)
    try:
        deadline = time.monotonic() + timeout
        while not _answers(url):
            if process.poll() is not None:
                raise RuntimeError(f"{script.name} exited with {process.returncode}:\n{server.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{script.name} did not answer at {url} within {timeout:.0f} s:\n{server.log()[-4000:]}"
                )
            time.sleep(0.2)
        yield server
    finally:
        _stop(process)


# ----------------------------------------------------------------------------- data to feed it

SHAPES = {"circle": (220, 50, 40), "square": (40, 80, 220), "triangle": (40, 170, 60)}


def shape_png(kind: str, seed: int, size: int = 48) -> bytes:
    """A PNG of one coloured shape, jittered in place, size and shade by ``seed`` (distinct bytes)."""
    rng = random.Random(f"{kind}-{seed}")
    image = Image.new("RGB", (size, size), (rng.randint(230, 255),) * 3)
    r = rng.randint(size // 4, size // 3)
    cx, cy = rng.randint(r, size - r), rng.randint(r, size - r)
    color = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in SHAPES[kind])
    draw = ImageDraw.Draw(image)
    if kind == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=color)
    elif kind == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=color)
    else:
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=color)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def class_folders_zip(path: Path, per_class: int = 6) -> Path:
    """A zip of class folders (``circle/0.png``…), the import format for pre-sorted images."""
    with zipfile.ZipFile(path, "w") as archive:
        for kind in SHAPES:
            for seed in range(per_class):
                archive.writestr(f"{kind}/{seed}.png", shape_png(kind, seed))
    return path
