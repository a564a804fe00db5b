"""Images in: bytes from any source, decoded safely into RGB, and turned into model tensors.

Every input (a path, bytes, a PIL image or a numpy array) is reduced to bytes first, so one content
hash (SHA-256) names it everywhere: in the store, the embedding cache and the API. Decoding rejects
whatever is not a complete, reasonably sized image of a known raster format with one error type,
:class:`ImageError`, whose message says what was wrong.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

# The largest image we decode: 50 megapixels (e.g. 8660×5773). A decompression bomb declares far
# more in a few bytes of header; we refuse it before allocating anything.
MAX_PIXELS = 50_000_000
# The largest encoded file we accept (matches the app's upload limit).
MAX_BYTES = 32 * 1024 * 1024
# Raster formats PIL decodes in-process. Anything else (EPS runs Ghostscript, SVG, HEIC, PDF…) is
# refused by name. Multi-picture JPEGs (MPO) open through the JPEG entry; PIL registers no "MPO" opener,
# and naming one here makes Image.open raise KeyError for every file that is not an earlier format.
ALLOWED_FORMATS = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF", "PPM", "ICO")

ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, never half an image

ImageSource = str | Path | bytes | bytearray | memoryview | Image.Image | np.ndarray


class ImageError(ValueError):
    """An input that is not a usable image; the message names the problem."""


def _encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _array_to_image(array: np.ndarray) -> Image.Image:
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
        raise ImageError(f"a numpy image must be (H, W), (H, W, 3) or (H, W, 4); got shape {array.shape}")
    if array.size == 0:
        raise ImageError("a numpy image must not be empty")
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all():
            raise ImageError("a float numpy image must hold finite values")
        scale = 255.0 if float(array.max()) <= 1.0 else 1.0  # floats in [0, 1] are the usual convention
        array = np.clip(array * scale, 0, 255).round().astype(np.uint8)
    elif array.dtype == np.uint16:
        array = (array // 257).astype(np.uint8)
    elif array.dtype == np.bool_:
        array = array.astype(np.uint8) * 255
    elif array.dtype != np.uint8:
        array = np.clip(array, 0, 255).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(array))


def to_bytes(source: ImageSource) -> bytes:
    """Returns the encoded bytes of ``source``; PIL images and arrays are encoded losslessly as PNG."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        try:
            size = path.stat().st_size
            if size > MAX_BYTES:
                raise ImageError(f"file is {size / 2**20:.1f} MB; the limit is {MAX_BYTES / 2**20:.0f} MB")
            return path.read_bytes()  # a directory, or a file gone since stat, fails here
        except OSError as error:
            raise ImageError(f"cannot read {path.name or path}: {error.strerror or error}") from error
    if isinstance(source, Image.Image):
        return _encode_png(source)
    if isinstance(source, np.ndarray):
        return _encode_png(_array_to_image(source))
    raise ImageError(f"cannot read an image from a {type(source).__name__}")


def content_hash(data: bytes) -> str:
    """SHA-256 hex digest: the id of an image everywhere in siamese."""
    return hashlib.sha256(data).hexdigest()


def _to_rgb(image: Image.Image) -> Image.Image:
    """Converts any PIL mode to RGB; transparency is composited over white, high bit depths scaled."""
    mode = image.mode
    if mode == "RGB" and "transparency" not in image.info:  # an RGB PNG may still have a transparent colour
        return image
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        if mode == "F":
            peak = float(array.max()) if array.size else 0.0
            array = array * 255.0 if peak <= 1.0 else array  # float images in [0, 1] are the usual case
        elif mode != "I" or (array.size and float(array.max()) > 255):
            array = array / 257.0  # 16-bit range onto 8 bits
        gray = np.clip(array, 0, 255).round().astype(np.uint8)
        return Image.fromarray(gray).convert("RGB")
    if (
        (mode == "P" and "transparency" in image.info)
        or mode in ("LA", "La", "PA", "RGBa")
        or (mode in ("L", "RGB") and "transparency" in image.info)
    ):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")


@dataclass(frozen=True)
class DecodedImage:
    """An RGB image with the hash and bytes it was decoded from."""

    image: Image.Image
    digest: str
    data: bytes


def decode_bytes(data: bytes, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Decodes ``data`` into an upright RGB image (first frame of an animation).

    Raises:
        ImageError: empty, oversized, not an image, an unsupported format, truncated or corrupt, or
            more than ``max_pixels`` pixels.
    """
    if len(data) == 0:
        raise ImageError("the file is empty (0 bytes)")
    if len(data) > MAX_BYTES:
        raise ImageError(f"file is {len(data) / 2**20:.1f} MB; the limit is {MAX_BYTES / 2**20:.0f} MB")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
        except UnidentifiedImageError:
            raise ImageError(_unrecognized_message(data)) from None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageError(f"the image declares too many pixels (limit {max_pixels:,})") from None
        except (OSError, SyntaxError, ValueError) as error:
            raise ImageError(f"the image header is truncated or corrupt ({error})") from None
        width, height = image.size
        if width <= 0 or height <= 0:
            raise ImageError(f"the image has no pixels ({width}×{height})")
        if width * height > max_pixels:
            raise ImageError(
                f"the image is {width}×{height} = {width * height:,} pixels; the limit is {max_pixels:,} "
                "(a decompression bomb, or a photo to downscale first)"
            )
        try:
            image.seek(0)  # animated GIF/WebP/APNG: the first frame
            image.load()
            image = ImageOps.exif_transpose(image)
            return _to_rgb(image)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise ImageError(f"the image declares too many pixels (limit {max_pixels:,})") from None
        except (OSError, SyntaxError, ValueError, EOFError, IndexError, MemoryError) as error:
            raise ImageError(f"the image is truncated or corrupt ({error})") from None


def _unrecognized_message(data: bytes) -> str:
    head = data[:512].lstrip().lower()
    supported = ", ".join(f.lower() for f in ALLOWED_FORMATS[:5])
    if head.startswith((b"<svg", b"<?xml")) and b"<svg" in data[:4096].lower():
        return f"SVG is not supported; upload a raster image ({supported})"
    if head.startswith((b"<!doctype html", b"<html")):
        return f"the file is HTML, not an image; upload a raster image ({supported})"
    if data[4:12] in (b"ftypheic", b"ftypheix", b"ftypmif1", b"ftypavif", b"ftyphevc", b"ftypmsf1"):
        return f"HEIC/AVIF images are not supported; convert to {supported}"
    if data[:4] == b"%PDF":
        return f"PDF is not supported; upload a raster image ({supported})"
    if data[:4] == b"PK\x03\x04":
        return "the file is a zip archive, not an image (use the dataset import for zips)"
    return f"not a recognized image; supported formats: {', '.join(f.lower() for f in ALLOWED_FORMATS)}"


def load_image(source: ImageSource, max_pixels: int = MAX_PIXELS) -> DecodedImage:
    """Reads, hashes and decodes one image from any supported source."""
    data = to_bytes(source)
    image = decode_bytes(data, max_pixels=max_pixels)
    return DecodedImage(image=image, digest=content_hash(data), data=data)


@dataclass(frozen=True)
class Preprocessing:
    """How a backbone wants its input: resize the shorter side, center-crop, normalize.

    Taken from the backbone's weights metadata (torchvision's ``weights.transforms()``), never
    hard-coded per call site; saved with every checkpoint.
    """

    resize_size: int
    crop_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def to_dict(self) -> dict:
        return {
            "resize_size": self.resize_size,
            "crop_size": self.crop_size,
            "mean": list(self.mean),
            "std": list(self.std),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Preprocessing:
        return cls(
            resize_size=int(data["resize_size"]),
            crop_size=int(data["crop_size"]),
            mean=tuple(float(x) for x in data["mean"]),
            std=tuple(float(x) for x in data["std"]),
        )

    def crop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The region of the original image that resize-then-center-crop keeps, in its coordinates."""
        scale = self.resize_size / min(width, height)
        side = self.crop_size / scale
        crop_w, crop_h = min(side, width), min(side, height)
        left, top = (width - crop_w) / 2, (height - crop_h) / 2
        return (left, top, left + crop_w, top + crop_h)

    def to_array(self, image: Image.Image) -> np.ndarray:
        """(crop, crop, 3) uint8. Resizes only the kept region, so a 1×10,000 strip costs nothing."""
        box = self.crop_box(*image.size)
        size = (self.crop_size, self.crop_size)
        return np.asarray(image.resize(size, Image.Resampling.BILINEAR, box=box, reducing_gap=None))

    def to_tensor(self, images: Sequence[Image.Image]):
        """(N, 3, crop, crop) float32 normalized batch, channels-last in memory."""
        import torch

        # In numpy, on the calling thread: torch would fan these small element-wise ops out to its
        # thread pool, and on a busy 2-core machine each fan-out waits for a descheduled thread (tens
        # of ms). The same float32 operations in the same order give the same bits.
        batch = np.stack([self.to_array(im) for im in images]).astype(np.float32)  # (N, H, W, 3)
        batch /= np.float32(255.0)
        batch -= np.array(self.mean, dtype=np.float32)
        batch /= np.array(self.std, dtype=np.float32)
        return torch.from_numpy(batch).permute(0, 3, 1, 2)  # (N, 3, H, W), channels-last strides
