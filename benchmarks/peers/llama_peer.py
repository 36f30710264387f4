"""benchmarks/cpu_peers.py's llama.cpp side: the library that benchmarks/peers/
build_llama_cpp.sh builds, driven through the ctypes bindings of the same sdist
(`llama_cpp/llama_cpp.py`: the C API one to one), so that it decodes the very token ids
the other systems get and hands back its greedy tokens.

Batch 1: the prompt in one `llama_decode`, then one token per call. 64 requests: every
prompt in batches of up to `n_batch` tokens (each sequence its own `seq_id`, logits for
its last prompt token only), then one call per step with one token of every sequence, as
llama.cpp's own parallel/server examples batch them. Greedy = the first maximal logit
(numpy's argmax, as torch's). The GGUF files and the library come from the cache that
the build script fills; `available()` says why not when they are missing."""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import time
import types

import common

CACHE = common.ROOT / ".cache" / "peers"
FILES = {"F32": "F32", "Q8_0": "Q8_0", "Q4_1": "Q4_1"}
MAX_SEQS, CTX_PER_SEQ, N_BATCH = 64, 256, 2048


def gguf(model: str, precision: str):
    import pathlib

    return CACHE / "models" / f"{pathlib.Path(model).name}-{FILES[precision]}.gguf"


def available(model: str) -> str | None:
    """None when llama.cpp can run here, else why not."""
    if not (CACHE / "build" / "bin" / "libllama.so").is_file():
        return f"no llama.cpp build under {CACHE}/build (bash benchmarks/peers/build_llama_cpp.sh)"
    missing = [p for p in FILES if not gguf(model, p).is_file()]
    if missing:
        return f"no {', '.join(missing)} GGUF under {CACHE}/models (bash benchmarks/peers/build_llama_cpp.sh)"
    if not list(CACHE.glob("llama_cpp_python-*/llama_cpp/llama_cpp.py")):
        return f"no llama-cpp-python sources under {CACHE} (bash benchmarks/peers/build_llama_cpp.sh)"
    return None


def bindings():
    """The sdist's `llama_cpp.llama_cpp` on our build. NOTE: its package __init__ imports
    the high-level API and its extra dependencies (diskcache...); only the ctypes layer
    is needed, so the package is registered bare and that one module imported."""
    src = sorted(CACHE.glob("llama_cpp_python-*/llama_cpp"))[-1]
    os.environ["LLAMA_CPP_LIB_PATH"] = str(CACHE / "build" / "bin")
    pkg = types.ModuleType("llama_cpp")
    pkg.__path__ = [str(src)]
    sys.modules["llama_cpp"] = pkg
    return importlib.import_module("llama_cpp.llama_cpp")


class LlamaPeer:
    def __init__(self, model: str, precision: str):
        import numpy as np

        self.np = np
        ll = self.ll = bindings()
        self._quiet = ll.llama_log_callback(lambda level, text, data: None)  # kept: C holds it
        ll.llama_log_set(self._quiet, ctypes.c_void_p(0))
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = ll.llama_model_load_from_file(str(gguf(model, precision)).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf(model, precision)}")
        self.vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        cp = ll.llama_context_default_params()
        cp.n_ctx = MAX_SEQS * CTX_PER_SEQ
        cp.n_batch = N_BATCH
        cp.n_seq_max = MAX_SEQS
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context")
        self.batch_buf = ll.llama_batch_init(N_BATCH, 0, 1)

    def threads(self, n: int) -> None:
        self.ll.llama_set_n_threads(self.ctx, n, n)

    def _clear(self) -> None:
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)

    def _decode(self, entries: list[tuple[int, int, int, bool]]):
        """entries (token, pos, seq, wants logits) -> greedy ids of the rows that want logits."""
        b = self.batch_buf
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        rc = self.ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        n_out = sum(e[3] for e in entries)
        if not n_out:
            return []
        ptr = self.ll.llama_get_logits(self.ctx)
        logits = self.np.ctypeslib.as_array(ptr, shape=(n_out, self.vocab))
        return logits.argmax(axis=1).tolist()

    def _prefill(self, prompts: list[list[int]]) -> list[int]:
        entries = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(prompts) for p, t in enumerate(ids)]
        first = []
        for at in range(0, len(entries), N_BATCH):
            first += self._decode(entries[at:at + N_BATCH])
        return first

    def stream(self, prompt: list[int], tokens: int) -> dict:
        self._clear()
        (tok,) = self._prefill([prompt])
        out, wall, cpu = [tok], [time.perf_counter()], [time.process_time()]
        while len(out) < tokens:
            (tok,) = self._decode([(tok, len(prompt) + len(out) - 1, 0, True)])
            out.append(tok)
            wall.append(time.perf_counter())
            cpu.append(time.process_time())
        return {"tokens": out, "wall": wall, "cpu": cpu}

    def batch(self, prompts: list[list[int]], tokens: int) -> list[list[int]]:
        self._clear()
        outs = [[t] for t in self._prefill(prompts)]
        for step in range(1, tokens):
            nxt = self._decode([(o[-1], len(p) + step - 1, s, True) for s, (p, o) in enumerate(zip(prompts, outs))])
            for o, t in zip(outs, nxt):
                o.append(t)
        return outs
