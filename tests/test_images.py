"""Images in: every source and PIL mode decodes to the right RGB pixels; everything else is refused."""

from __future__ import annotations

import hashlib
import io
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from siamese import images
from siamese.images import ImageError, Preprocessing, content_hash, decode_bytes, load_image, to_bytes
from tests import images_factory as factory

IMAGENET = Preprocessing(resize_size=256, crop_size=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def pixels(image: Image.Image) -> np.ndarray:
    assert image.mode == "RGB"
    return np.asarray(image).astype(int)  # (H, W, 3)


def composite_over_white(rgb, alpha: int) -> np.ndarray:
    """Alpha blending worked out by hand: c·a + 255·(1 − a)."""
    a = alpha / 255
    return np.array([c * a + 255 * (1 - a) for c in rgb])


# --- sources -------------------------------------------------------------------------------------


def test_path_bytes_and_buffers_give_the_same_image_and_hash(tmp_path):
    data = factory.encode(factory.noise((12, 9), seed=1), "PNG")
    path = tmp_path / "noise.png"
    path.write_bytes(data)
    expected = pixels(factory.noise((12, 9), seed=1))
    for source in (path, str(path), data, bytearray(data), memoryview(data)):
        loaded = load_image(source)
        np.testing.assert_array_equal(pixels(loaded.image), expected)
        assert loaded.digest == hashlib.sha256(data).hexdigest()
        assert loaded.data == data


def test_pil_image_loads_losslessly():
    image = factory.noise((10, 7), seed=2)
    loaded = load_image(image)
    np.testing.assert_array_equal(pixels(loaded.image), pixels(image))
    assert loaded.digest == content_hash(to_bytes(image))


def test_numpy_uint8_rgb():
    array = np.random.default_rng(3).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    np.testing.assert_array_equal(pixels(load_image(array).image), array)


def test_numpy_float_in_unit_range_is_scaled_to_255():
    array = np.array([[[0.0, 0.5, 1.0], [0.25, 0.75, 0.1]]])  # (1, 2, 3)
    expected = [[[round(v * 255) for v in px] for px in row] for row in array.tolist()]
    np.testing.assert_array_equal(pixels(load_image(array).image), expected)


def test_numpy_uint16_is_scaled_to_8_bits():
    array = np.array([[[65535, 32896, 0], [257 * 10, 257 * 200, 65535]]], dtype=np.uint16)
    expected = [[[v // 257 for v in px] for px in row] for row in array.tolist()]
    np.testing.assert_array_equal(pixels(load_image(array).image), expected)


def test_numpy_grayscale_2d_and_single_channel():
    gray = np.array([[0, 100], [200, 255]], dtype=np.uint8)
    for array in (gray, gray[:, :, None]):
        out = pixels(load_image(array).image)
        assert out.shape == (2, 2, 3)
        for channel in range(3):
            np.testing.assert_array_equal(out[:, :, channel], gray)


def test_numpy_rgba_is_composited_over_white():
    array = np.array([[[200, 50, 0, 255], [200, 50, 0, 0], [0, 0, 255, 64]]], dtype=np.uint8)
    out = pixels(load_image(array).image)[0]
    np.testing.assert_array_equal(out[0], [200, 50, 0])
    np.testing.assert_array_equal(out[1], [255, 255, 255])
    np.testing.assert_allclose(out[2], composite_over_white((0, 0, 255), 64), atol=1)


@pytest.mark.parametrize("array", [np.zeros((2, 2, 2), np.uint8), np.zeros((2, 2, 3, 1), np.uint8), np.zeros((0, 3))])
def test_numpy_of_a_wrong_shape_is_refused(array):
    with pytest.raises(ImageError, match="numpy image"):
        load_image(array)


def test_unknown_source_type_and_missing_path_are_refused(tmp_path):
    with pytest.raises(ImageError, match="int"):
        load_image(42)
    with pytest.raises(ImageError, match=r"cannot read missing\.png"):
        load_image(tmp_path / "missing.png")
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(ImageError, match=r"cannot read folder\.png"):
        load_image(tmp_path / "folder.png")


# --- EXIF orientation ----------------------------------------------------------------------------


def test_exif_orientation_6_is_applied():
    data = factory.exif_rotated_jpeg(factory.quadrants((40, 20)), orientation=6)
    decoded = decode_bytes(data)
    assert decoded.size == (20, 40)  # width and height swapped
    raw = Image.open(io.BytesIO(data)).convert("RGB")  # the stored, unrotated pixels
    assert raw.size == (40, 20)
    np.testing.assert_array_equal(pixels(decoded), pixels(raw.transpose(Image.Transpose.ROTATE_270)))
    # Orientation 6 means "rotate 90° clockwise to display": the bottom-left (blue) quadrant is now top-left.
    out = pixels(decoded)
    for (x, y), color in {(5, 10): factory.BLUE, (15, 10): factory.RED, (5, 30): (255, 255, 255)}.items():
        np.testing.assert_allclose(out[y, x], color, atol=8)
    np.testing.assert_allclose(out[30, 15], factory.GREEN, atol=8)


# --- PIL modes -----------------------------------------------------------------------------------


def test_mode_1_bilevel():
    image = Image.new("1", (4, 2), 0)
    image.putpixel((1, 0), 1)
    out = pixels(decode_bytes(factory.encode(image, "PNG")))
    assert out[0, 1].tolist() == [255, 255, 255]
    assert out[0, 0].tolist() == [0, 0, 0]


def test_mode_l_grayscale():
    out = pixels(decode_bytes(factory.png_bytes(color=100, mode="L")))
    assert (out == 100).all()


def test_mode_la_transparency_over_white():
    image = Image.new("LA", (3, 1))
    image.putdata([(100, 255), (100, 0), (100, 128)])
    out = pixels(decode_bytes(factory.encode(image, "PNG")))[0]
    assert out[0].tolist() == [100] * 3
    assert out[1].tolist() == [255] * 3
    np.testing.assert_allclose(out[2], composite_over_white((100, 100, 100), 128), atol=1)


def test_mode_p_with_transparent_index_becomes_white():
    image = Image.new("P", (2, 1))
    image.putpalette([255, 0, 0, 0, 255, 0] + [0, 0, 0] * 254)
    image.putdata([0, 1])  # index 0 (red) is the transparent one
    data = factory.encode(image, "PNG", transparency=0)
    assert Image.open(io.BytesIO(data)).mode == "P"
    out = pixels(decode_bytes(data))[0]
    assert out[0].tolist() == [255, 255, 255]
    assert out[1].tolist() == [0, 255, 0]


@pytest.mark.parametrize(("mode", "transparent", "opaque"), [("L", 7, 90), ("RGB", (255, 0, 0), (0, 0, 255))])
def test_png_transparent_colour_becomes_white(mode, transparent, opaque):
    image = Image.new(mode, (2, 1))
    image.putdata([transparent, opaque])
    data = factory.encode(image, "PNG", transparency=transparent)  # a tRNS chunk: no alpha channel
    assert Image.open(io.BytesIO(data)).info.get("transparency") == transparent
    out = pixels(decode_bytes(data))[0]
    assert out[0].tolist() == [255, 255, 255]
    assert out[1].tolist() == pixels(Image.new(mode, (1, 1), opaque).convert("RGB"))[0, 0].tolist()


def test_mode_rgba_composited_over_white():
    image = Image.new("RGBA", (3, 1))
    image.putdata([(200, 50, 0, 255), (200, 50, 0, 0), (0, 0, 255, 64)])
    out = pixels(decode_bytes(factory.encode(image, "PNG")))[0]
    assert out[0].tolist() == [200, 50, 0]
    assert out[1].tolist() == [255, 255, 255]
    np.testing.assert_allclose(out[2], composite_over_white((0, 0, 255), 64), atol=1)


def test_mode_cmyk_jpeg():
    data = factory.jpeg_bytes(color=(0, 255, 255, 0), mode="CMYK")  # no cyan, full magenta and yellow: red
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    out = pixels(decode_bytes(data))
    np.testing.assert_allclose(out, np.broadcast_to([255, 0, 0], out.shape), atol=3)


def test_mode_i16_png_is_scaled_to_8_bits():
    values = np.array([[65535, 32896, 0, 2570]], dtype=np.uint16)
    data = factory.encode(Image.fromarray(values), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    out = pixels(decode_bytes(data))[0]
    assert out[:, 0].tolist() == [255, 128, 0, 10]  # v/257 rounded
    assert (out == out[:, :1]).all()  # gray: R = G = B


def test_mode_f_float_tiff():
    values = np.array([[0.0, 0.25, 0.5, 1.0]], dtype=np.float32)
    data = factory.encode(Image.fromarray(values, "F"), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "F"
    out = pixels(decode_bytes(data))[0]
    assert out[:, 0].tolist() == [round(v * 255) for v in values[0].tolist()]


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF", "WEBP", "PPM"])
def test_lossless_formats_decode_exactly(fmt):
    image = factory.noise((9, 7), seed=4)
    extra = {"lossless": True} if fmt == "WEBP" else {}
    np.testing.assert_array_equal(pixels(decode_bytes(factory.encode(image, fmt, **extra))), pixels(image))


@pytest.mark.parametrize("make", [factory.animated_gif, factory.animated_webp])
def test_animation_uses_its_first_frame(make):
    for first in (factory.GREEN, factory.BLUE):
        colors = [first] + [c for c in (factory.RED, factory.GREEN, factory.BLUE) if c != first]
        out = pixels(decode_bytes(make(colors)))
        np.testing.assert_array_equal(out, np.broadcast_to(first, out.shape))


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"just some text, not pixels\n", "not a recognized image"),
        (factory.HTML, "HTML"),
        (factory.SVG, "SVG"),
        (b"%PDF-1.4\n%\xe2\xe3\n", "PDF"),
        (b"PK\x03\x04" + b"\0" * 40, "zip"),
        (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "not a recognized image"),  # never Ghostscript
        (factory.png_declaring(100_000, 100_000), "pixels"),  # PIL's own bomb check
        (factory.png_declaring(8000, 8000), "pixels"),  # 64 Mpx: over our limit, under PIL's
    ],
)
def test_refused_with_a_message_naming_the_problem(data, message):
    with pytest.raises(ImageError, match=message):
        decode_bytes(data)


def test_html_renamed_png_and_empty_file_are_refused(tmp_path):
    page = tmp_path / "page.png"
    page.write_bytes(factory.HTML)
    with pytest.raises(ImageError, match="HTML"):
        load_image(page)
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        load_image(empty)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95])
def test_truncated_files_are_refused(fmt, fraction):
    data = factory.encode(factory.noise((64, 64), seed=5), fmt)
    with pytest.raises(ImageError, match="truncated"):
        decode_bytes(data[: int(len(data) * fraction)])


def test_bilevel_decompression_bomb_is_refused_before_decoding():
    data = factory.encode(Image.new("1", (12_000, 12_000)), "PNG")  # 144 Mpx in a small file
    assert len(data) < 100_000
    start = time.perf_counter()
    with pytest.raises(ImageError, match="pixels"):
        decode_bytes(data)
    assert time.perf_counter() - start < 1.0


def test_max_pixels_is_a_parameter():
    data = factory.png_bytes(size=(10, 10))
    assert decode_bytes(data, max_pixels=100).size == (10, 10)
    with pytest.raises(ImageError, match="100 pixels; the limit is 99"):
        decode_bytes(data, max_pixels=99)


def test_oversized_bytes_and_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(images, "MAX_BYTES", 1000)
    data = factory.encode(factory.noise((64, 64), seed=6), "PNG")
    assert len(data) > 1000
    with pytest.raises(ImageError, match="MB"):
        decode_bytes(data)
    path = tmp_path / "big.png"
    path.write_bytes(data)
    with pytest.raises(ImageError, match="limit"):
        load_image(path)


# --- preprocessing -------------------------------------------------------------------------------


def test_long_strip_preprocesses_quickly_to_the_crop_size():
    strip = decode_bytes(factory.png_bytes(size=(1, 10_000), color=(10, 20, 30)))
    start = time.perf_counter()
    array = IMAGENET.to_array(strip)
    batch = IMAGENET.to_tensor([strip, strip.transpose(Image.Transpose.ROTATE_90)])
    assert time.perf_counter() - start < 0.5
    assert array.shape == (224, 224, 3)
    assert (array == [10, 20, 30]).all()
    assert batch.shape == (2, 3, 224, 224)


def test_crop_box_by_hand():
    # 512×256: the short side is already 256, so the 224 crop is centred: (512 − 224)/2 = 144, (256 − 224)/2 = 16.
    assert IMAGENET.crop_box(512, 256) == (144, 16, 368, 240)
    # 1024×512: scale 1/2, so 448 source pixels are kept.
    assert IMAGENET.crop_box(1024, 512) == (288, 32, 736, 480)


def test_to_tensor_normalizes_a_solid_colour_exactly():
    color = (30, 128, 250)
    out = IMAGENET.to_tensor([factory.solid((50, 40), color)])
    assert out.shape == (1, 3, 224, 224) and out.dtype == torch.float32
    for channel in range(3):
        expected = (color[channel] / 255 - IMAGENET.mean[channel]) / IMAGENET.std[channel]
        assert torch.allclose(out[0, channel], torch.tensor(expected), atol=1e-5)


@pytest.mark.parametrize("size", [(300, 200), (200, 300), (640, 480), (257, 256)])
def test_to_tensor_matches_torchvision_transforms(size):
    """Same pipeline as Resize+CenterCrop+ToTensor+Normalize, up to resampling rounding.

    Ours resizes only the kept region (with sub-pixel box coordinates); torchvision resizes the whole
    image to an integer size and crops with rounded offsets. On a smooth image the two agree within one
    grey level (1/255/std ≈ 0.017 after normalization); where the geometry is the same they are equal.
    """
    image = factory.gradient(size)
    reference = T.Compose(
        [
            T.Resize(IMAGENET.resize_size),
            T.CenterCrop(IMAGENET.crop_size),
            T.ToTensor(),
            T.Normalize(IMAGENET.mean, IMAGENET.std),
        ]
    )(image)
    ours = IMAGENET.to_tensor([image])[0]
    one_grey_level = 1 / 255 / min(IMAGENET.std)
    assert (ours - reference).abs().max().item() <= one_grey_level + 1e-4


def test_preprocessing_dict_round_trip():
    assert Preprocessing.from_dict(IMAGENET.to_dict()) == IMAGENET
