"""benchmarks/cpu_peers.py's inflight side: the engine on a CPU, as a user builds it."""

from __future__ import annotations

import time

import common  # noqa: F401 (puts the repository on sys.path)


class EnginePeer:
    def __init__(self, model: str, precision: str):
        import torch

        from inflight.engine import Engine, EngineConfig, SamplingParams

        self.torch = torch
        self.params = SamplingParams
        # fp32 activations for every precision: the quantized folders' layers pick their
        # CPU kernels (engine/quant/linear.py)
        self.engine = Engine(EngineConfig(model=model, dtype="float32", max_num_seqs=64,
                                          max_num_batched_tokens=2048, enable_prefix_caching=False))
        self.n = 0

    def threads(self, n: int) -> None:
        self.torch.set_num_threads(n)

    def _params(self, tokens: int):
        return self.params(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    def stream(self, prompt: list[int], tokens: int) -> dict:
        eng = self.engine
        self.n += 1
        rid = f"s{self.n}"
        eng.add_request(rid, prompt_token_ids=prompt, params=self._params(tokens))
        out, wall, cpu = [], [], []
        while eng.has_unfinished():
            for o in eng.step():
                if o.request_id != rid:
                    continue
                now, c = time.perf_counter(), time.process_time()
                new = o.new_token_ids  # this step's tokens (final outputs too)
                out += new
                wall += [now] * len(new)
                cpu += [c] * len(new)
        return {"tokens": out, "wall": wall, "cpu": cpu}

    def batch(self, prompts: list[list[int]], tokens: int) -> list[list[int]]:
        return [o.token_ids for o in self.engine.generate(prompts, self._params(tokens))]
