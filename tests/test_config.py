"""Settings: every variable of API.md from the environment, flags over them, malformed values refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from siamese.config import Settings, parse_auth, parse_settings

ENV = {
    "SIAMESE_DATA_DIR": "/srv/siamese",
    "SIAMESE_BACKBONE": "mobilenet_v3_small",
    "SIAMESE_PRETRAINED": "0",
    "SIAMESE_WEIGHTS": "/models/start.safetensors",
    "SIAMESE_AUTH": "ann:pw1,bob:s3:cret",
    "SIAMESE_HUB_DATASET": "me/labels",
}


def test_defaults_with_an_empty_environment():
    settings = Settings.from_env({})
    assert settings.data_dir == Path("./data")
    assert settings.backbone == "resnet18"
    assert settings.pretrained is True
    assert settings.weights is None
    assert settings.auth == ()
    assert settings.hub_dataset is None
    assert parse_settings([], {}) == settings


def test_every_variable_is_read():
    settings = Settings.from_env(ENV)
    assert settings.data_dir == Path("/srv/siamese")
    assert settings.backbone == "mobilenet_v3_small"
    assert settings.pretrained is False
    assert settings.weights == Path("/models/start.safetensors")
    assert settings.auth == (("ann", "pw1"), ("bob", "s3:cret"))  # a password may contain ':'
    assert settings.hub_dataset == "me/labels"


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("SIAMESE_BACKBONE", "small_cnn")
    monkeypatch.setenv("SIAMESE_DATA_DIR", "/tmp/elsewhere")
    settings = Settings.from_env()
    assert settings.backbone == "small_cnn" and settings.data_dir == Path("/tmp/elsewhere")


def test_empty_variables_mean_unset():
    settings = Settings.from_env(dict.fromkeys(ENV, ""))
    assert settings == Settings.from_env({})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        ("Yes", True),
        (" on ", True),
        ("0", False),
        ("FALSE", False),
        ("no", False),
        ("off", False),
    ],
)
def test_pretrained_flag_spellings(value, expected):
    assert Settings.from_env({"SIAMESE_PRETRAINED": value}).pretrained is expected


@pytest.mark.parametrize("value", ["2", "maybe", "yes please"])
def test_malformed_pretrained_is_refused(value):
    with pytest.raises(ValueError, match="boolean"):
        Settings.from_env({"SIAMESE_PRETRAINED": value})


@pytest.mark.parametrize("value", ["alice", "alice:", ":secret", "alice:pw,bob", "alice:pw, :x"])
def test_malformed_auth_is_refused(value):
    with pytest.raises(ValueError, match="user:password"):
        Settings.from_env({"SIAMESE_AUTH": value})


def test_auth_parsing_tolerates_spaces_and_trailing_commas():
    assert parse_auth(" ann:pw1 , bob:pw2 ,") == (("ann", "pw1"), ("bob", "pw2"))
    assert parse_auth("") == () and parse_auth(None) == ()


def test_flags_override_the_environment():
    argv = [
        "--data-dir", "/flag/data",
        "--backbone", "small_cnn",
        "--pretrained", "1",
        "--weights", "/flag/w.safetensors",
        "--auth", "carol:pw",
        "--hub-dataset", "you/data",
    ]  # fmt: skip
    settings = parse_settings(argv, ENV)
    assert settings == Settings(
        data_dir=Path("/flag/data"),
        backbone="small_cnn",
        pretrained=True,
        weights=Path("/flag/w.safetensors"),
        auth=(("carol", "pw"),),
        hub_dataset="you/data",
    )


def test_absent_flags_keep_the_environment():
    assert parse_settings(["--backbone", "small_cnn"], ENV) == dataclasses.replace(
        Settings.from_env(ENV), backbone="small_cnn"
    )
    assert parse_settings(["--pretrained", "0"], {}).pretrained is False


def test_malformed_flags_are_refused():
    with pytest.raises(ValueError, match="user:password"):
        parse_settings(["--auth", "nopassword"], {})
    with pytest.raises(SystemExit):
        parse_settings(["--pretrained", "maybe"], {})


def test_settings_are_frozen_and_hide_passwords():
    settings = Settings.from_env(ENV)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.backbone = "resnet50"
    assert "pw1" not in repr(settings)


def test_runtime_and_precision_settings():
    assert Settings.from_env({}).runtime == "onnx" and Settings.from_env({}).precision == "fp32"
    env = {"SIAMESE_RUNTIME": " Torch ", "SIAMESE_PRECISION": "INT8"}
    settings = Settings.from_env(env)
    assert (settings.runtime, settings.precision) == ("torch", "int8")
    flagged = parse_settings(["--runtime", "onnx", "--precision", "fp32"], env)
    assert (flagged.runtime, flagged.precision) == ("onnx", "fp32")


@pytest.mark.parametrize(
    "env, message",
    [({"SIAMESE_RUNTIME": "tensorrt"}, "SIAMESE_RUNTIME must be one of onnx, torch"),
     ({"SIAMESE_PRECISION": "fp16"}, "SIAMESE_PRECISION must be one of fp32, int8")],
)  # fmt: skip
def test_unknown_runtime_or_precision_is_refused_by_name(env, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env)
