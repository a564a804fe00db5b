"""Real image bytes made with PIL, for tests: every format and mode the decoder must handle.

Each function returns what a user would upload (encoded bytes) or a PIL image to encode; sizes are
tiny so tests stay fast. Colours are RGB tuples unless the mode says otherwise.
"""

from __future__ import annotations

import io
import random
import struct
import zlib
from collections.abc import Sequence

import numpy as np
from PIL import Image

RED = (255, 0, 0)
GREEN = (0, 255, 0)
BLUE = (0, 0, 255)


def encode(image: Image.Image, format: str, **save_kwargs) -> bytes:
    """``image`` encoded as ``format`` (PNG, JPEG, GIF, WEBP, TIFF, BMP…)."""
    buffer = io.BytesIO()
    image.save(buffer, format=format, **save_kwargs)
    return buffer.getvalue()


def solid(size: tuple[int, int] = (8, 8), color=RED, mode: str = "RGB") -> Image.Image:
    """A one-colour image; ``color`` is in ``mode``'s terms (an int for L, a 4-tuple for RGBA…)."""
    return Image.new(mode, size, color)


def png_bytes(size: tuple[int, int] = (8, 8), color=RED, mode: str = "RGB", **save_kwargs) -> bytes:
    return encode(solid(size, color, mode), "PNG", **save_kwargs)


def jpeg_bytes(size: tuple[int, int] = (8, 8), color=RED, mode: str = "RGB", quality: int = 95) -> bytes:
    return encode(solid(size, color, mode), "JPEG", quality=quality)


def gradient(size: tuple[int, int] = (64, 48)) -> Image.Image:
    """A smooth RGB image (red grows left to right, green top to bottom, blue constant)."""
    width, height = size
    x = np.linspace(0, 255, width)[None, :].repeat(height, axis=0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, axis=1)
    array = np.stack([x, y, np.full_like(x, 96)], axis=2).round().astype(np.uint8)
    return Image.fromarray(array, "RGB")


def noise(size: tuple[int, int] = (16, 16), seed: int = 0) -> Image.Image:
    """A seeded random RGB image: distinct seeds give distinct images (and distinct hashes)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def quadrants(size: tuple[int, int] = (40, 20)) -> Image.Image:
    """Four coloured quadrants (red, green / blue, white), so any rotation or flip is visible."""
    width, height = size
    image = Image.new("RGB", size, (255, 255, 255))
    image.paste(RED, (0, 0, width // 2, height // 2))
    image.paste(GREEN, (width // 2, 0, width, height // 2))
    image.paste(BLUE, (0, height // 2, width // 2, height))
    return image


def exif_rotated_jpeg(image: Image.Image | None = None, orientation: int = 6, quality: int = 95) -> bytes:
    """``image`` stored as a JPEG with an EXIF Orientation tag (6: display rotated 90° clockwise)."""
    image = quadrants() if image is None else image
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    return encode(image, "JPEG", exif=exif.tobytes(), quality=quality)


def animated(colors: Sequence[tuple[int, int, int]], format: str = "GIF", size: tuple[int, int] = (8, 8)) -> bytes:
    """An animation with one solid frame per colour (GIF or WEBP)."""
    frames = [Image.new("RGB", size, color) for color in colors]
    extra = {"lossless": True} if format.upper() == "WEBP" else {}
    return encode(frames[0], format, save_all=True, append_images=frames[1:], duration=100, loop=0, **extra)


def animated_gif(colors: Sequence[tuple[int, int, int]] = (RED, GREEN, BLUE), size: tuple[int, int] = (8, 8)) -> bytes:
    return animated(colors, "GIF", size)


def animated_webp(colors: Sequence[tuple[int, int, int]] = (RED, GREEN, BLUE), size: tuple[int, int] = (8, 8)) -> bytes:
    return animated(colors, "WEBP", size)


def png_declaring(width: int, height: int) -> bytes:
    """A valid-looking PNG header that declares ``width``×``height`` pixels, with one tiny IDAT.

    A decompression bomb in miniature: a few dozen bytes that promise gigapixels.
    """

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


SVG = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>\n'
HTML = b"<!DOCTYPE html>\n<html><body>not an image</body></html>\n"


def shape_image(shape: str, color, seed: int, size: int = 48) -> bytes:
    """A PNG of a filled circle or square on a light background, jittered by ``seed``."""
    from PIL import ImageDraw

    rng = random.Random(seed)
    background = tuple(rng.randint(200, 255) for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    side = rng.randint(size // 2, size - 12)
    x, y = rng.randint(2, size - side - 2), rng.randint(2, size - side - 2)
    box = [x, y, x + side, y + side]
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=color)
    return encode(image, "PNG")


def shapes_dataset(per_class: int = 20, seed: int = 0) -> list[tuple[str, bytes]]:
    """(class, png bytes): red circles and blue squares, an easy two-class task for tests."""
    items = []
    for i in range(per_class):
        items.append(("circle", shape_image("circle", (220, 30, 30), seed * 10_000 + 2 * i)))
        items.append(("square", shape_image("square", (30, 30, 220), seed * 10_000 + 2 * i + 1)))
    return items


def labeled_pairs(items: list[tuple[str, bytes]], n: int, seed: int = 0) -> list[tuple[bytes, bytes, str]]:
    """``n`` distinct pairs of ``items``, about half same, with their true labels."""
    rng = random.Random(seed)
    seen, pairs = set(), []
    while len(pairs) < n:
        i, j = rng.sample(range(len(items)), 2)
        same_wanted = len(pairs) % 2 == 0
        if (items[i][0] == items[j][0]) != same_wanted or frozenset((i, j)) in seen:
            continue
        seen.add(frozenset((i, j)))
        pairs.append((items[i][1], items[j][1], "same" if same_wanted else "different"))
    return pairs
