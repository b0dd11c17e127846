"""Image preparation against an independent NumPy/PIL transcription of TRELLIS.2's steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from deliverykit.errors import InputError
from trellis2_npu.image import load_image, preprocess_image, synthetic_image, to_pixel_values


def _rgba_with_object(size=(300, 200), box=(40, 30, 161, 131)) -> Image.Image:
    """Opaque-ish object inside a transparent canvas; colours vary so that a wrong crop shows."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 4), dtype=np.uint8)
    pixels[:, :, 3] = 0
    left, top, right, bottom = box
    pixels[top:bottom, left:right, 3] = 255
    pixels[top + 5 : top + 10, left + 5 : left + 10, 3] = 128  # semi-transparent patch inside the object
    return Image.fromarray(pixels)


def test_alpha_crop_and_premultiply_match_hand_computation():
    image = _rgba_with_object()
    out = preprocess_image(image)
    pixels = np.asarray(image).astype(np.float32) / 255
    # Object occupies x 40..160, y 30..130: bbox (40, 30, 160, 130), size 120, centre (100, 80).
    expected = pixels[20:140, 40:160]
    expected = (expected[:, :, :3] * expected[:, :, 3:4] * 255).astype(np.uint8)
    assert out.mode == "RGB" and out.size == (120, 120)
    np.testing.assert_array_equal(np.asarray(out), expected)


def _noise(seed: int, size: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8))


def test_rgb_and_opaque_rgba_are_used_whole():
    rgb = _noise(1, size=64)
    assert np.array_equal(np.asarray(preprocess_image(rgb)), np.asarray(rgb))
    opaque = rgb.convert("RGBA")
    assert np.array_equal(np.asarray(preprocess_image(opaque)), np.asarray(rgb))


def test_long_side_is_shrunk_to_1024():
    out = preprocess_image(_noise(2, size=2048))
    assert out.size == (1024, 1024)


def test_pixel_values_are_lanczos_resized_and_imagenet_normalised():
    image = _noise(3, size=100)
    values = to_pixel_values(image, 64)
    resized = np.asarray(image.resize((64, 64), Image.Resampling.LANCZOS)).astype(np.float32) / 255
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    expected = ((resized - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)
    assert values.shape == (1, 3, 64, 64) and values.dtype == torch.float32
    np.testing.assert_allclose(values.numpy(), expected, atol=1e-6)


def test_synthetic_input_is_deterministic_and_has_real_alpha():
    image = synthetic_image(42)
    assert np.array_equal(np.asarray(image), np.asarray(synthetic_image(42)))
    assert not np.array_equal(np.asarray(image), np.asarray(synthetic_image(43)))
    assert image.size == (512, 512) and image.mode == "RGBA"
    prepared = preprocess_image(image)  # the demo input goes through the crop + premultiply path
    assert prepared.size[0] == prepared.size[1] < 512


def test_16_bit_grayscale_is_scaled_not_clipped(tmp_path):
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    path = tmp_path / "gray16.png"
    Image.fromarray(ramp).save(path)
    image = load_image(path)
    assert image.mode == "RGB"
    channel = np.asarray(image)[:, :, 0].astype(np.int64)
    np.testing.assert_array_equal(channel, np.rint(ramp / 257.0).astype(np.int64))
    assert channel.min() == 0 and channel.max() == 255  # a clipping convert() would give 255 almost everywhere


@pytest.mark.parametrize(
    ("mode", "expected_mode"), [("L", "RGB"), ("LA", "RGBA"), ("P", "RGB"), ("RGBA", "RGBA"), ("CMYK", "RGB")]
)
def test_modes_become_rgb_or_rgba(tmp_path, mode, expected_mode):
    path = tmp_path / f"image-{mode}.{'jpg' if mode == 'CMYK' else 'png'}"
    _noise(4, size=32).convert(mode).save(path)
    assert load_image(path).mode == expected_mode


def test_fully_transparent_image_is_a_one_line_input_error():
    image = Image.new("RGBA", (32, 32), (255, 0, 0, 0))
    image.putpixel((0, 0), (255, 0, 0, 100))  # real alpha, but nothing above 80 %
    with pytest.raises(InputError, match="no pixel above 80% opacity"):
        preprocess_image(image)


def test_unreadable_inputs_name_the_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_image(tmp_path / "missing.png")
    with pytest.raises(InputError, match="is not a file"):
        load_image(tmp_path)
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(InputError, match=r"cannot read .*notes\.png as an image"):
        load_image(text)


def test_feature_preview_separates_distinct_regions_and_is_deterministic():
    from trellis2_npu.preview import conditioning_preview, feature_pca_image

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, generator=generator), torch.randn(32, generator=generator)
    grid = torch.stack([a if col < 4 else b for _ in range(8) for col in range(8)])  # left half a, right half b
    features = torch.cat([torch.zeros(5, 32), grid + 0.01 * torch.randn(64, 32, generator=generator)])[None]
    pca = np.asarray(feature_pca_image(features, num_prefix_tokens=5)).astype(int)
    left, right = pca[:, :100].reshape(-1, 3), pca[:, 156:].reshape(-1, 3)
    # The first component (red) is the a/b direction: one value per region, far apart. The other two only see the
    # small noise, stretched to the full range.
    assert abs(left[:, 0].mean() - right[:, 0].mean()) > 200
    assert left[:, 0].std() < 5 and right[:, 0].std() < 5
    assert np.array_equal(pca, np.asarray(feature_pca_image(features, num_prefix_tokens=5)))
    assert conditioning_preview(synthetic_image(1, size=64), features, 5).size == (512, 256)
