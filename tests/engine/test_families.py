"""Every supported family, token by token against transformers' `generate` (greedy, fp32)
on tiny random checkpoints built by transformers' own config classes (tests/tiny_families.py):
batched with chunked prefill and prefix-cache hits, and under preemption.

INFLIGHT_TEST_DEVICE=cuda runs the same checks on a GPU (benchmarks/gpu/run_all.sh), with
INFLIGHT_TEST_DTYPE=bfloat16 there: bf16 rounding differs between any two implementations,
so a bf16 sequence may leave transformers' only at a near-tie of fp32 logits.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from inflight.engine import Engine, EngineConfig, SamplingParams
from tests.tiny_families import FAMILIES, SLIDING, VOCAB, write_tiny_family

DEVICE = os.environ.get("INFLIGHT_TEST_DEVICE", "cpu")
DTYPE = os.environ.get("INFLIGHT_TEST_DTYPE", "float32")
N = 16
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


def family_prompts(seed: int = 0) -> list[list[int]]:
    """Six prompts of 20-90 tokens; four share a 40-token prefix (prefix-cache hits)."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(5, VOCAB) for _ in range(n)]  # noqa: E731
    shared = ids(40)
    return [ids(20), shared + ids(50), ids(33), shared + ids(7), shared + ids(25), shared + ids(1)]


@pytest.fixture(scope="module")
def prompts():
    return family_prompts()


class Family:
    """One family's checkpoint and transformers' greedy continuations of the prompts."""

    def __init__(self, path, prompts):
        from transformers import AutoModelForCausalLM

        self.path = path
        dtype = getattr(torch, DTYPE)
        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(DEVICE).eval()
        self.refs = [self.greedy(self.hf, p) for p in prompts]

    @staticmethod
    def greedy(model, prompt, n=N):
        with torch.inference_mode():
            out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=n,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    def check(self, outs, prompts):
        got = [o.token_ids for o in outs]
        if DTYPE == "float32":
            assert got == self.refs
            return
        from transformers import AutoModelForCausalLM

        hf32 = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32).to(DEVICE).eval()
        exact = 0
        for p, g, e in zip(prompts, got, self.refs):
            if g == e:
                exact += 1
                continue
            i = next(i for i, (a, b) in enumerate(zip(g, e)) if a != b)
            with torch.inference_mode():
                logits = hf32(torch.tensor([p + e[:i]], device=DEVICE)).logits[0, -1]
            gap = abs(logits[g[i]] - logits[e[i]]).item()
            assert gap < 1.0, f"diverged at token {i}, fp32 logit gap {gap:.3f} (not a near-tie)"
        assert exact >= len(prompts) // 2, f"only {exact}/{len(prompts)} equal transformers' in {DTYPE}"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory, prompts):
    return request.param, Family(write_tiny_family(tmp_path_factory.mktemp(request.param), request.param),
                                 prompts)


def engine(path, **kw) -> Engine:
    kw.setdefault("dtype", DTYPE)
    return Engine(EngineConfig(model=path, device=DEVICE, debug_checks=True, **kw))


def test_batched_chunked_prefix_cached(family, prompts):
    name, fam = family
    eng = engine(fam.path, num_kv_blocks=256, block_size=8, max_num_batched_tokens=32)
    outs = eng.generate(prompts, GREEDY)
    fam.check(outs, prompts)
    stats = eng.stats()
    assert stats["prefix_cache_hit_tokens"] > 0
    assert stats["kv_blocks_used"] == 0


def test_preempted(family, prompts):
    name, fam = family
    eng = engine(fam.path, num_kv_blocks=14, block_size=16, max_num_batched_tokens=64,
                 enable_prefix_caching=False)
    fam.check(eng.generate(prompts, GREEDY), prompts)
    assert eng.stats()["preemptions"] > 0


@pytest.mark.parametrize("name", SLIDING)
def test_windows_matter(name, tmp_path, prompts):
    """The sliding families' checks can fail: the same checkpoint without its window
    (every layer full attention) gives other tokens in transformers."""
    from transformers import AutoModelForCausalLM

    if name == "gemma3":
        kw = dict(layer_types=["full_attention", "full_attention"])
    elif name == "mistral":
        kw = dict(sliding_window=None)
    else:
        kw = dict(use_sliding_window=False)
    windowed = AutoModelForCausalLM.from_pretrained(write_tiny_family(tmp_path / "w", name)).eval()
    full = AutoModelForCausalLM.from_pretrained(write_tiny_family(tmp_path / "f", name, **kw)).eval()
    long = [p for p in prompts if len(p) > 40]
    assert [Family.greedy(windowed, p) for p in long] != [Family.greedy(full, p) for p in long]


def test_gemma3_softcapped_logits(tmp_path, prompts):
    """Final-logit soft-capping (Gemma) changes probabilities, not the greedy argmax: the
    engine's prompt logprobs equal transformers' log-softmax."""
    from transformers import AutoModelForCausalLM

    path = write_tiny_family(tmp_path / "g", "gemma3", final_logit_softcapping=3.0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()
    eng = engine(path, num_kv_blocks=64, dtype="float32")
    for prompt, scored in zip(prompts[:2], eng.score(prompts[:2])):
        with torch.inference_mode():
            logits = hf(torch.tensor([prompt], device=DEVICE)).logits[0].float()
        assert logits.abs().max().item() <= 3.0  # the cap is in force
        logp = logits.log_softmax(-1)
        want = logp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()
        assert max(abs(a - b) for a, b in zip(scored.logprobs[1:], want)) < 1e-4


def test_yarn_runs_past_max_position_embeddings(tmp_path, prompts):
    """A YaRN config's context is original x factor (Qwen2.5's 128k from a 32k config),
    even past max_position_embeddings; transformers runs it there too."""
    rope = dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=32)
    path = write_tiny_family(tmp_path / "y", "qwen2.5-yarn", max_position_embeddings=64, rope_parameters=rope)
    fam = Family(path, prompts)
    eng = engine(path, num_kv_blocks=128, max_num_batched_tokens=48)
    assert eng.max_model_len == 128 and max(map(len, prompts)) + N > 64
    fam.check(eng.generate(prompts, GREEDY), prompts)
