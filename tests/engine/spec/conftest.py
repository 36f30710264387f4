"""Fixtures for speculative decoding: a tiny draft model sharing the tiny target's tokenizer,
the methods under test, and prompts whose greedy continuations repeat (so drafts from the
request's own context are accepted, some several in a row)."""

from __future__ import annotations

import random
import shutil

import pytest

from inflight.engine import Engine, EngineConfig, SamplingParams

N = 24
GREEDY = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="session")
def draft_model_path(tiny_model_path, tmp_path_factory):
    """The tiny target with noise on its layers' weights: the same tokenizer, a draft that
    is right about a third of the time (accepted runs and rejections both)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("tiny-draft") / "draft"
    shutil.copytree(tiny_model_path, path)
    weights = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    for name, w in weights.items():
        if "layers" in name and "norm" not in name:
            weights[name] = w + 0.05 * w.std() * torch.randn(w.shape, generator=gen)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def methods(target, draft) -> dict[str, dict]:
    """speculative_config per method; every one may speculate at any batch size here."""
    always = {"disable_by_batch_size": None}
    return {
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                  "prompt_lookup_max": 3, **always},
        "draft": {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3, **always},
        "self-draft": {"method": "draft_model", "model": str(target), "num_speculative_tokens": 4,
                       **always},
        "suffix": {"method": "suffix", "num_speculative_tokens": 6, **always},
    }


def spec_prompts(n: int = 10, seed: int = 3) -> list[list[int]]:
    """Prompts 3..40 tokens long; every other one is an earlier one again with a new tail
    (prefix-cache hits, and the suffix cache sees similar outputs)."""
    rng = random.Random(seed)
    out: list[list[int]] = []
    for i in range(n):
        if i % 2 and out:
            out.append(out[-1][:max(2, len(out[-1]) - 2)] + [rng.randrange(5, 320)])
        else:
            out.append([rng.randrange(5, 320) for _ in range(rng.randint(3, 40))])
    return out


def make(path, spec=None, **kw) -> Engine:
    kw.setdefault("num_kv_blocks", 256)
    return Engine(EngineConfig(model=path, debug_checks=True, speculative_config=spec, **kw))


def drain(eng: Engine) -> dict:
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
    return finals
