"""Checkpoints: safetensors weights and JSON metadata round-trip exactly; nothing is ever unpickled."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from siamese import checkpoint
from siamese.checkpoint import CheckpointError, load_checkpoint, model_metadata, read_metadata, save_checkpoint
from siamese.config import ModelConfig
from siamese.model import ContrastiveSiameseNetwork, build_model

SMALL = ModelConfig(backbone="small_cnn", pretrained=False, embedding_dim=16, head_hidden=32)


def trained_looking(config: ModelConfig, seed: int = 0) -> ContrastiveSiameseNetwork:
    """A model whose weights and BatchNorm statistics differ from a fresh build's."""
    torch.manual_seed(seed)
    model = build_model(config)
    crop = min(model.preprocessing.crop_size, 64)  # any size the backbone accepts; small keeps this fast
    with torch.no_grad():
        model.train()(torch.randn(2, 3, crop, crop), torch.randn(2, 3, crop, crop))  # moves running stats
    return model.eval()


def probe(model: ContrastiveSiameseNetwork) -> torch.Tensor:
    crop = min(model.preprocessing.crop_size, 64)
    images = torch.randn(3, 3, crop, crop, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        return model.eval().embed(images)


def extra_meta() -> dict:
    return {"threshold": 0.4375, "metrics": {"auc": 0.91, "accuracy": 0.875, "n_train_pairs": 12}, "parent": "v0003"}


@pytest.fixture
def saved(tmp_path) -> tuple[ContrastiveSiameseNetwork, Path, dict]:
    model = trained_looking(SMALL)
    meta = model_metadata(model, **extra_meta())
    return model, save_checkpoint(model, tmp_path / "v0004", meta), meta


@pytest.mark.parametrize(
    "config", [SMALL, ModelConfig(backbone="resnet18", pretrained=False)], ids=["small_cnn", "resnet18"]
)
def test_round_trip_reproduces_embeddings_exactly(tmp_path, config):
    model = trained_looking(config)
    directory = save_checkpoint(model, tmp_path / "v1", model_metadata(model))
    assert sorted(p.name for p in directory.iterdir()) == ["meta.json", "model.safetensors"]
    loaded, _ = load_checkpoint(directory)
    assert torch.equal(probe(loaded), probe(model))
    fresh = build_model(config)  # the comparison could fail: a fresh build embeds differently
    assert not torch.equal(probe(fresh), probe(model))
    assert not loaded.training


def test_metadata_round_trips(saved):
    model, directory, meta = saved
    loaded, loaded_meta = load_checkpoint(directory)
    assert loaded_meta == meta
    assert read_metadata(directory) == meta
    assert json.loads((directory / "meta.json").read_text()) == meta
    for key, value in extra_meta().items():
        assert loaded_meta[key] == value
    assert loaded.config == model.config
    assert loaded.preprocessing == model.preprocessing
    assert loaded_meta["backbone"] == "small_cnn" and loaded_meta["embedding_dim"] == 16


def test_pretrained_flag_survives_as_metadata(tmp_path):
    model = trained_looking(SMALL)
    model.pretrained = True  # as if it had started from ImageNet weights
    directory = save_checkpoint(model, tmp_path / "v1", model_metadata(model))
    loaded, meta = load_checkpoint(directory)
    assert meta["pretrained_init"] is True and loaded.pretrained is True


def test_a_lone_safetensors_file_loads_with_its_header_metadata(saved, tmp_path):
    model, directory, meta = saved
    lone = tmp_path / "elsewhere" / "downloaded.safetensors"
    lone.parent.mkdir()
    shutil.copy(directory / "model.safetensors", lone)
    assert read_metadata(lone) == meta
    loaded, loaded_meta = load_checkpoint(lone)
    assert loaded_meta == meta
    assert torch.equal(probe(loaded), probe(model))


def test_a_model_safetensors_without_meta_json_uses_the_header(saved):
    model, directory, meta = saved
    (directory / "meta.json").unlink()
    loaded, loaded_meta = load_checkpoint(directory)
    assert loaded_meta == meta
    assert torch.equal(probe(loaded), probe(model))


class _Payload:
    """Unpickling this creates a file: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_given_as_a_checkpoint_is_refused_unopened(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "model.pt"
    torch.save({"head.0.weight": _Payload(marker)}, evil)
    torch.load(evil, weights_only=False)  # the payload is live
    assert marker.exists()
    marker.unlink()

    with pytest.raises(CheckpointError, match=r"model\.pt"):
        load_checkpoint(evil)
    assert not marker.exists()


def test_a_pickle_named_model_safetensors_is_refused_unopened(saved, tmp_path):
    _, directory, _ = saved
    marker = tmp_path / "pwned"
    torch.save({"head.0.weight": _Payload(marker)}, directory / "model.safetensors")  # meta.json stays valid
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(directory)
    (directory / "meta.json").unlink()
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(directory)
    assert not marker.exists()


def test_weights_of_another_shape_are_refused_clearly(saved):
    _, directory, meta = saved
    wrong = {**meta, "config": {**meta["config"], "embedding_dim": 32}}
    (directory / "meta.json").write_text(json.dumps(wrong))
    with pytest.raises(CheckpointError, match="does not fit a small_cnn model"):
        load_checkpoint(directory)


def test_weights_of_another_backbone_are_refused_clearly(saved):
    _, directory, meta = saved
    wrong = {**meta, "config": {**meta["config"], "backbone": "mobilenet_v3_small"}}
    (directory / "meta.json").write_text(json.dumps(wrong))
    with pytest.raises(CheckpointError, match="does not fit a mobilenet_v3_small model"):
        load_checkpoint(directory)


def test_invalid_config_in_metadata_is_refused(saved):
    _, directory, meta = saved
    (directory / "meta.json").write_text(json.dumps({**meta, "config": {**meta["config"], "head_depth": 0}}))
    with pytest.raises(CheckpointError, match="invalid model config"):
        load_checkpoint(directory)


def test_foreign_safetensors_and_missing_paths_are_refused(tmp_path):
    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(2)}, str(foreign))
    with pytest.raises(CheckpointError, match="no siamese metadata"):
        load_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def test_saving_into_an_existing_directory_refuses(saved):
    _, directory, _ = saved
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    other = trained_looking(SMALL, seed=5)
    with pytest.raises(FileExistsError, match="already exists"):
        save_checkpoint(other, directory, model_metadata(other))
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_model", disk_full)
    model = trained_looking(SMALL)
    parent = tmp_path / "models"
    parent.mkdir()
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(model, parent / "v1", model_metadata(model))
    assert list(parent.iterdir()) == []


def test_a_failed_metadata_write_leaves_nothing_behind(tmp_path):
    model = trained_looking(SMALL)
    with pytest.raises(TypeError):
        save_checkpoint(model, tmp_path / "v1", model_metadata(model, unserializable=object()))
    assert list(tmp_path.iterdir()) == []
