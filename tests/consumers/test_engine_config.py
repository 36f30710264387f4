"""Engine knobs from INFLIGHT_* (Settings) into EngineConfig; `--device cuda:auto` claims;
the engine thread binds the engine's device."""

from __future__ import annotations

import queue
import subprocess
import sys
import textwrap
import threading

import pytest

from inflight.consumers.engine_bridge import ENGINE_SETTINGS, build_engine, engine_overrides
from inflight.consumers.thread_messages import Slots
from inflight.consumers.gpu_claim import claim_gpu
from inflight.schemas import Settings
from inflight.schemas.errors import ConfigError


def test_every_engine_knob_comes_from_the_environment(monkeypatch):
    from inflight.engine import EngineConfig

    env = {"INFLIGHT_DEVICE": "cuda", "INFLIGHT_DTYPE": "bfloat16", "INFLIGHT_MAX_NUM_SEQS": "128",
           "INFLIGHT_MAX_NUM_BATCHED_TOKENS": "4096", "INFLIGHT_MAX_MODEL_LEN": "1024",
           "INFLIGHT_KV_CACHE_BYTES": str(3 << 30), "INFLIGHT_BLOCK_SIZE": "32",
           "INFLIGHT_ENABLE_PREFIX_CACHING": "false", "INFLIGHT_KERNELS": "triton"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    kw = engine_overrides(Settings())
    cfg = EngineConfig(model="unused", **kw)  # every key is a real EngineConfig field
    assert (cfg.device, cfg.dtype, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
            cfg.kv_cache_bytes, cfg.block_size, cfg.enable_prefix_caching, cfg.kernels) == (
        "cuda", "bfloat16", 128, 4096, 1024, 3 << 30, 32, False, "triton")
    assert set(ENGINE_SETTINGS) <= set(EngineConfig.__dataclass_fields__)


def test_defaults_and_flag_precedence():
    s = Settings(worker_max_inflight=48)
    # everything else: the engine defaults
    assert engine_overrides(s) == {"max_num_seqs": 48, "enable_prefix_caching": True}
    s = Settings(device="cpu", dtype="float32", kv_cache_bytes=1 << 20, max_num_seqs=8)
    kw = engine_overrides(s, device="cuda", dtype="float16", kv_cache_mb=64, max_num_seqs=4)
    assert kw["device"] == "cuda" and kw["dtype"] == "float16"
    assert kw["kv_cache_bytes"] == 64 << 20 and kw["max_num_seqs"] == 4


def test_build_engine_uses_settings(tiny_model):
    s = Settings(block_size=8, max_num_batched_tokens=64, enable_prefix_caching=False,
                 kv_cache_bytes=1 << 20)
    engine = build_engine(s, str(tiny_model))
    assert (engine.config.block_size, engine.config.max_num_batched_tokens) == (8, 64)
    assert engine.config.enable_prefix_caching is False and engine.config.kv_cache_bytes == 1 << 20


def test_speculative_config_from_the_environment_the_cli_and_compose(monkeypatch, tiny_model):
    from inflight.cli.commands import _overrides
    from inflight.engine import EngineConfig
    from inflight.cli.main import build_parser
    from tests.deploy.files import COMPOSE, load_compose

    monkeypatch.setenv("INFLIGHT_SPECULATIVE_CONFIG", '{"method": "ngram", "num_speculative_tokens": 3}')
    engine = build_engine(Settings(kv_cache_bytes=1 << 20), str(tiny_model))
    assert engine.config.speculative_config.num_speculative_tokens == 3 and engine.spec is not None
    # the worker's flag wins
    args = build_parser().parse_args(["worker", "--speculative-config",
                                      '{"method": "suffix", "num_speculative_tokens": 5}'])
    assert _overrides(args, Settings()).speculative_config == args.speculative_config
    with pytest.raises(SystemExit, match="--speculative-config: speculative_config is not valid JSON"):
        _overrides(build_parser().parse_args(["worker", "--speculative-config", "{ngram"]), Settings())
    # compose: unset is off; SPECULATIVE_CONFIG=... turns it on
    monkeypatch.delenv("INFLIGHT_SPECULATIVE_CONFIG")
    text = COMPOSE.read_text().replace("${SPECULATIVE_CONFIG:-}", "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    for doc, want in ((load_compose(), None), (load_compose(text), 4)):
        value = doc["services"]["worker"]["environment"]["INFLIGHT_SPECULATIVE_CONFIG"]
        spec = engine_overrides(Settings(speculative_config=value or None)).get("speculative_config")
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
    from inflight.cli.main import build_parser

    monkeypatch.setenv("INFLIGHT_TENSOR_PARALLEL_SIZE", "2")
    assert engine_overrides(Settings())["tensor_parallel_size"] == 2
    assert engine_overrides(Settings(), tensor_parallel_size=4)["tensor_parallel_size"] == 4
    args = build_parser().parse_args(["worker", "--tensor-parallel-size", "4"])
    assert args.tensor_parallel_size == 4


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
