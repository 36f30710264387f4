"""engine.model_folder (`inflight model fetch`): the default model is converted once and
reused; --model checks."""

from __future__ import annotations

import json
import os
import time

import pytest

from inflight.engine.model_folder import ensure_default_model, is_hf_folder, resolve_model
from inflight.engine.errors import ModelError


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    s = tmp_path_factory.mktemp("cache")
    t0 = time.monotonic()
    path = ensure_default_model(s)
    return s, path, time.monotonic() - t0


def test_default_model_is_converted_to_an_hf_folder(converted):
    _, path, _ = converted
    assert is_hf_folder(path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert "quantization_config" not in cfg
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tok.decode(tok.encode("Hello, world!").ids) == "Hello, world!"


def test_second_fetch_reuses_the_cache(converted):
    s, path, first = converted
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    t0 = time.monotonic()
    again = ensure_default_model(s)
    assert again == path
    assert time.monotonic() - t0 < 1.0 < first
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before


def test_explicit_model_path(tmp_path, converted):
    _, path, _ = converted
    assert resolve_model(path, tmp_path) == path
    with pytest.raises(ModelError, match="not a Hugging Face model folder"):
        resolve_model(tmp_path, tmp_path)
    os.environ.pop("INFLIGHT_MODEL_PATH", None)
