"""A picture of what the conditioning model saw and produced, for people to look at.

Left: the image as DINOv3 receives it (after TRELLIS.2's crop and premultiply). Right: the patch features projected
on their first three principal components as RGB, the usual way to look at DINO features (with real weights, object
parts get consistent colours; with random weights the map is texture-like, which is expected).
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

PANEL = 256


def feature_pca_image(features: torch.Tensor, num_prefix_tokens: int) -> Image.Image:
    """``[1, prefix + H·W, C]`` features → an ``H×W`` RGB image of the first 3 principal components."""
    patches = features[0, num_prefix_tokens:].detach().float().cpu()
    side = round(patches.shape[0] ** 0.5)
    if side * side != patches.shape[0]:
        raise ValueError(f"{patches.shape[0]} patch tokens do not form a square grid")
    centered = (patches - patches.mean(dim=0, keepdim=True)).double()
    _, eigenvectors = torch.linalg.eigh(
        centered.T @ centered
    )  # ascending eigenvalues: deterministic, unlike SVD sketches
    components = eigenvectors[:, -3:].flip(-1)
    # An eigenvector's sign is arbitrary: make each one's largest entry positive, so colours are reproducible.
    signs = torch.sign(components.gather(0, components.abs().argmax(dim=0, keepdim=True)))
    projected = (centered @ (components * signs)).float()
    low, high = projected.quantile(0.01, dim=0), projected.quantile(0.99, dim=0)
    scaled = ((projected - low) / (high - low).clamp_min(1e-8)).clamp(0, 1)
    pixels = (scaled.reshape(side, side, 3).numpy() * 255).astype(np.uint8)
    return Image.fromarray(pixels).resize((PANEL, PANEL), Image.Resampling.NEAREST)


def conditioning_preview(prepared: Image.Image, features: torch.Tensor, num_prefix_tokens: int) -> Image.Image:
    """Side by side: the prepared input and the feature PCA map, ``2·256 × 256``."""
    canvas = Image.new("RGB", (2 * PANEL, PANEL))
    canvas.paste(prepared.convert("RGB").resize((PANEL, PANEL), Image.Resampling.LANCZOS), (0, 0))
    canvas.paste(feature_pca_image(features, num_prefix_tokens), (PANEL, 0))
    return canvas
