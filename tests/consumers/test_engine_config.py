"""Engine options: INFLIGHT_* and `inflight worker` flags set one Settings object, and
consumers.engine_bridge.engine_config makes the one EngineConfig of it; `--device cuda:auto`
claims; the engine thread binds the engine's device."""

from __future__ import annotations

import dataclasses
import queue
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from inflight.cli.commands import with_flags
from inflight.cli.main import build_parser
from inflight.consumers.engine_bridge import build_engine, engine_config
from inflight.consumers.thread_messages import Slots
from inflight.consumers.gpu_claim import claim_gpu
from inflight.schemas import Settings
from inflight.schemas.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _worker_flags(*argv: str, settings: Settings | None = None) -> Settings:
    return with_flags(build_parser().parse_args(["worker", *argv]), settings or Settings())


def test_every_engine_option_is_one_settings_field_one_flag_one_docs_row():
    """What adding an engine option takes: the EngineConfig field, the Settings field of the
    same name (engine_option()), a worker flag whose dest is that name, a docs row. Nothing
    else names it: engine_config passes every engine option on."""
    from inflight.engine import EngineConfig

    names = Settings.engine_option_names()
    assert "kv_cache_dtype" in names and "speculative_config" in names
    assert set(names) <= {f.name for f in dataclasses.fields(EngineConfig)}
    flags = set(vars(build_parser().parse_args(["worker"])))  # the dests of its flags
    assert set(names) <= flags, sorted(set(names) - flags)
    documented = set(re.findall(r"`INFLIGHT_([A-Z0-9_]+)`", DOCS.read_text()))
    assert {n.upper() for n in names} <= documented


def test_every_engine_option_comes_from_the_environment(monkeypatch, tiny_model):
    env = {"INFLIGHT_DEVICE": "cpu", "INFLIGHT_DTYPE": "bfloat16", "INFLIGHT_MAX_NUM_SEQS": "128",
           "INFLIGHT_MAX_NUM_BATCHED_TOKENS": "4096", "INFLIGHT_MAX_MODEL_LEN": "1024",
           "INFLIGHT_KV_CACHE_BYTES": str(3 << 30), "INFLIGHT_BLOCK_SIZE": "32",
           "INFLIGHT_ENABLE_PREFIX_CACHING": "false", "INFLIGHT_KERNELS": "triton",
           "INFLIGHT_CUDA_GRAPHS": "0", "INFLIGHT_KV_CACHE_DTYPE": "int8",
           "INFLIGHT_KV_CACHE_MEMORY_FRACTION": "0.5", "INFLIGHT_MODEL_PATH": str(tiny_model)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = engine_config(Settings())
    assert (cfg.device, cfg.dtype, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
            cfg.kv_cache_bytes, cfg.block_size, cfg.enable_prefix_caching, cfg.kernels,
            cfg.cuda_graphs, cfg.kv_cache_dtype, cfg.kv_cache_memory_fraction) == (
        "cpu", "bfloat16", 128, 4096, 1024, 3 << 30, 32, False, "triton", False, "int8", 0.5)
    assert cfg.model == str(tiny_model)


def test_defaults_and_flag_precedence(tiny_model):
    s = Settings(worker_max_inflight=48, model_path=str(tiny_model))
    cfg, default = engine_config(s), engine_config(Settings(model_path=str(tiny_model),
                                                            max_num_seqs=48))
    assert cfg == default and cfg.max_num_seqs == 48  # the rest: the engine's own defaults
    s = Settings(device="cpu", dtype="float32", kv_cache_bytes=1 << 20, max_num_seqs=8,
                 model_path=str(tiny_model))
    cfg = engine_config(_worker_flags("--dtype", "float16", "--kv-cache-mb", "64",
                                      "--max-num-seqs", "4", "--max-inflight", "9", settings=s))
    assert (cfg.device, cfg.dtype, cfg.kv_cache_bytes, cfg.max_num_seqs) == (
        "cpu", "float16", 64 << 20, 4)
    with pytest.raises(ConfigError, match="max_num_seqs='x'.*INFLIGHT_MAX_NUM_SEQS"):
        _worker_flags("--max-num-seqs", "x")


def test_build_engine_uses_settings(tiny_model):
    s = Settings(block_size=8, max_num_batched_tokens=64, enable_prefix_caching=False,
                 kv_cache_bytes=1 << 20, model_path=str(tiny_model))
    engine = build_engine(s)
    assert (engine.config.block_size, engine.config.max_num_batched_tokens) == (8, 64)
    assert engine.config.enable_prefix_caching is False and engine.config.kv_cache_bytes == 1 << 20


def test_speculative_config_from_the_environment_the_cli_and_compose(monkeypatch, tiny_model):
    from inflight.engine import EngineConfig
    from tests.deploy.files import COMPOSE, load_compose

    monkeypatch.setenv("INFLIGHT_SPECULATIVE_CONFIG", '{"method": "ngram", "num_speculative_tokens": 3}')
    engine = build_engine(Settings(kv_cache_bytes=1 << 20, model_path=str(tiny_model)))
    assert engine.config.speculative_config.num_speculative_tokens == 3 and engine.spec is not None
    # the worker's flag wins
    flag = '{"method": "suffix", "num_speculative_tokens": 5}'
    assert _worker_flags("--speculative-config", flag).speculative_config == flag
    with pytest.raises(ConfigError, match="speculative_config is not valid JSON"):
        _worker_flags("--speculative-config", "{ngram")
    # compose: unset is off; SPECULATIVE_CONFIG=... turns it on
    monkeypatch.delenv("INFLIGHT_SPECULATIVE_CONFIG")
    text = COMPOSE.read_text().replace("${SPECULATIVE_CONFIG:-}", "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    for doc, want in ((load_compose(), None), (load_compose(text), 4)):
        value = doc["services"]["worker"]["environment"]["INFLIGHT_SPECULATIVE_CONFIG"]
        spec = Settings(speculative_config=value or None).engine_options().get("speculative_config")
        assert (spec and EngineConfig(model="m", speculative_config=spec).speculative_config
                .num_speculative_tokens) == want


def test_claim_gpu_hands_out_distinct_devices(tmp_path):
    first, h0 = claim_gpu(tmp_path, 2)
    second, h1 = claim_gpu(tmp_path, 2)
    assert (first, second) == (0, 1)
    with pytest.raises(ConfigError, match="at most 2 workers"):
        claim_gpu(tmp_path, 2)
    h0.close()  # a worker that stops frees its GPU
    again, h2 = claim_gpu(tmp_path, 2)
    assert again == 0
    h1.close()
    h2.close()
    with pytest.raises(ConfigError, match="no CUDA device"):
        claim_gpu(tmp_path, 0)


def test_claim_gpu_hands_out_aligned_blocks_for_tensor_parallel_workers(tmp_path):
    """Workers of 2 ranks on 5 GPUs: GPUs 0-1, then 2-3; GPU 4 is left over."""
    first, c0 = claim_gpu(tmp_path, 5, 2)
    second, c1 = claim_gpu(tmp_path, 5, 2)
    assert (first, second) == (0, 2) and len(c0.handles) == 2
    with pytest.raises(ConfigError, match="at most 2 workers of 2 GPUs each"):
        claim_gpu(tmp_path, 5, 2)
    one, c2 = claim_gpu(tmp_path, 5)  # a one-GPU worker takes the one left
    assert one == 4
    c0.close()
    assert claim_gpu(tmp_path, 5, 2)[0] == 0
    with pytest.raises(ConfigError, match="needs 4 GPUs per worker, but this host shows 2"):
        claim_gpu(tmp_path, 2, 4)


def test_tensor_parallel_size_comes_from_the_environment_and_the_flag(monkeypatch):
    monkeypatch.setenv("INFLIGHT_TENSOR_PARALLEL_SIZE", "2")
    assert Settings().engine_options()["tensor_parallel_size"] == 2
    assert _worker_flags("--tensor-parallel-size", "4").engine_options()["tensor_parallel_size"] == 4


def test_claim_survives_kill_9_of_the_holder(tmp_path):
    """The kernel drops the lock of a killed process: its GPU is free for the restart."""
    code = textwrap.dedent(f"""
        import sys, time
        from inflight.consumers.gpu_claim import claim_gpu
        index, handle = claim_gpu({str(tmp_path)!r}, 1)
        print(index, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "0"
        with pytest.raises(ConfigError):
            claim_gpu(tmp_path, 1)
    finally:
        proc.kill()
        proc.wait()
    index, handle = claim_gpu(tmp_path, 1)
    assert index == 0
    handle.close()


def test_engine_loop_binds_its_thread_first():
    """The engine thread makes the engine's device its current device before it touches
    the engine (CUDA's current device is per thread)."""
    from inflight.consumers.engine_loop import EngineLoop

    calls = []
    added = threading.Event()

    class Engine:
        def bind_thread(self):
            calls.append(("bind", threading.current_thread().name))

        def add_request(self, request_id, **kw):
            calls.append(("add", threading.current_thread().name))
            added.set()

        def step(self):
            return []

        def abort(self, request_id):
            return False

        def has_unfinished(self):
            return False

    loop = EngineLoop(Engine(), queue.Queue(), Slots(4)).start()
    loop.add("a", prompt_token_ids=[1])
    assert added.wait(5)
    loop.stop()
    assert loop.join(5) and loop.error is None
    assert calls == [("bind", "engine"), ("add", "engine")]
