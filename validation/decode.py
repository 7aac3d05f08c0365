"""Real loading for the decode regime: seeded JPEGs, decoded and augmented with Pillow.

The images are generated when the dataset is built (not timed): one JPEG per
batch of a rank, its area the batch's size factor (``regimes.size_factors``)
times ``image_px``², so a slow rank has larger images and batches vary. A
sample decodes its batch's JPEG (the decode is real work each time), takes a
random crop and a random horizontal flip seeded by the sample index, and
becomes float32 CHW in [0, 1]. torch-free: the job wraps the arrays.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image

QUALITY = 90


def make_jpeg(seed: tuple[int, ...], width: int, height: int) -> bytes:
    """A deterministic photo-like JPEG: smooth colour fields plus grain."""
    rng = np.random.default_rng(list(seed))
    coarse = rng.integers(
        0, 256, size=(max(height // 16, 2), max(width // 16, 2), 3), dtype=np.uint8
    )
    smooth = Image.fromarray(coarse, "RGB").resize((width, height), Image.Resampling.BICUBIC)
    grain = rng.integers(-20, 21, size=(height, width, 3), dtype=np.int16)
    pixels = np.clip(np.asarray(smooth, dtype=np.int16) + grain, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=QUALITY)
    return buf.getvalue()


SIDE_STEP = 16  # sides are rounded to it: few distinct images to generate per rank


def image_side(image_px: int, crop_px: int, factor: float) -> int:
    """Side (px) of a square image of area ``factor`` × ``image_px``², never below the crop."""
    side = round(image_px * math.sqrt(max(factor, 0.0)) / SIDE_STEP) * SIDE_STEP
    return max(crop_px, side)


def augment(jpeg: bytes, crop_px: int, seed: int) -> np.ndarray:
    """Decode, random crop of ``crop_px``², random horizontal flip: float32 [3, crop, crop]."""
    rng = np.random.default_rng(seed)
    with Image.open(io.BytesIO(jpeg)) as img:
        img = img.convert("RGB")
        width, height = img.size
        left = int(rng.integers(0, width - crop_px + 1))
        top = int(rng.integers(0, height - crop_px + 1))
        img = img.crop((left, top, left + crop_px, top + crop_px))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = np.asarray(img, dtype=np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)) / 255.0
