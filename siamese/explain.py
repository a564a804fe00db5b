"""Why two images match: heat maps of what drives their similarity under a model.

The map is gradient × input of the pair's cosine similarity with respect to each image, smoothed
and normalized: the pixels whose change would move the similarity most, weighted by their presence.
It works for every backbone (no hooks into architecture-specific layers).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .model import ContrastiveSiameseNetwork


def similarity_saliency(model: ContrastiveSiameseNetwork, image_a: Image.Image, image_b: Image.Image, device="cpu"):
    """Returns ``(similarity, heat_a, heat_b)``; heats are (crop, crop) float arrays in [0, 1]."""
    batch = model.preprocessing.to_tensor([image_a, image_b]).to(device).requires_grad_(True)  # (2, 3, H, W)
    with torch.inference_mode(False), torch.enable_grad():
        embeddings = model.embed(batch)
        similarity = (embeddings[0] * embeddings[1]).sum()
        (grad,) = torch.autograd.grad(similarity, batch)
    saliency = (grad * batch).abs().sum(dim=1, keepdim=True)  # (2, 1, H, W)
    kernel = max(3, (batch.shape[-1] // 14) | 1)  # smooth over ~1/14 of the side: regions, not pixels
    saliency = F.avg_pool2d(saliency, kernel, stride=1, padding=kernel // 2)[:, 0]
    flat = saliency.flatten(1)
    low, high = flat.min(dim=1).values, flat.max(dim=1).values
    heat = (saliency - low[:, None, None]) / (high - low).clamp_min(1e-12)[:, None, None]
    heat = heat.detach().cpu().numpy()
    return float(similarity.detach()), heat[0], heat[1]


def _colormap(heat: np.ndarray) -> np.ndarray:
    """(H, W) in [0, 1] -> (H, W, 3) uint8, dark blue → red → yellow."""
    r = np.clip(1.5 * heat, 0, 1)
    g = np.clip(2.0 * heat - 1.0, 0, 1)
    b = np.clip(0.6 - 1.2 * heat, 0, 1)
    return (np.stack([r, g, b], axis=-1) * 255).astype(np.uint8)


def overlay(model: ContrastiveSiameseNetwork, image: Image.Image, heat: np.ndarray, size: int = 320) -> Image.Image:
    """The region the model saw, with the heat map blended over it."""
    prep = model.preprocessing
    view = image.resize((size, size), Image.Resampling.BILINEAR, box=prep.crop_box(*image.size))
    heat_image = Image.fromarray(_colormap(heat)).resize((size, size), Image.Resampling.BILINEAR)
    return Image.blend(view.convert("RGB"), heat_image, alpha=0.45)
