"""Heat maps: on two images identical except for one patch, the patch is what lights up.

The model is a pixel-space network (flatten + identity head), so the answer is known without the code
under test: the embedding is the normalized image, and the similarity's gradient is the difference
between the two images, which is zero outside the patch.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch import nn

from siamese.backbones import Backbone
from siamese.config import ModelConfig
from siamese.explain import overlay, similarity_saliency
from siamese.images import Preprocessing
from siamese.model import ContrastiveSiameseNetwork

SIDE = 28
PATCH = (slice(4, 11), slice(16, 23))  # rows, columns of the region that differs


def pixel_model() -> ContrastiveSiameseNetwork:
    prep = Preprocessing(resize_size=SIDE, crop_size=SIDE, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    dim = 3 * SIDE * SIDE
    backbone = Backbone(nn.Flatten(), dim, prep, pretrained=False)
    model = ContrastiveSiameseNetwork(backbone, ModelConfig(backbone="pixels", embedding_dim=dim, head_depth=1))
    with torch.no_grad():
        model.head[0].weight.copy_(torch.eye(dim))
        model.head[0].bias.zero_()
    return model.eval()


def pair(seed: int) -> tuple[Image.Image, Image.Image]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
    changed = base.copy()
    changed[PATCH] = 255 - changed[PATCH]
    return Image.fromarray(base), Image.fromarray(changed)


def test_the_patch_that_differs_is_what_the_heat_map_shows():
    model = pixel_model()
    inside = np.zeros((SIDE, SIDE), bool)
    inside[PATCH] = True
    for seed in range(3):
        image_a, image_b = pair(seed)
        similarity, heat_a, heat_b = similarity_saliency(model, image_a, image_b)
        a = model.preprocessing.to_tensor([image_a]).flatten()
        b = model.preprocessing.to_tensor([image_b]).flatten()
        assert abs(similarity - float(a @ b / (a.norm() * b.norm()))) < 1e-5
        for heat in (heat_a, heat_b):
            assert heat.shape == (SIDE, SIDE) and heat.min() == 0.0 and abs(heat.max() - 1.0) < 1e-6
            assert heat[inside].mean() > 5 * heat[~inside].mean()
            peak = np.unravel_index(heat.argmax(), heat.shape)
            assert 2 <= peak[0] <= 12 and 14 <= peak[1] <= 24  # within the patch, give or take the smoothing


def test_overlay_is_an_rgb_picture_of_the_requested_size():
    model = pixel_model()
    image_a, image_b = pair(0)
    _, heat_a, _ = similarity_saliency(model, image_a, image_b)
    picture = overlay(model, image_a, heat_a, size=64)
    assert picture.size == (64, 64) and picture.mode == "RGB"
