"""Fixtures for engine tests: a tiny random Llama on disk and greedy references from HF."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_llama import tiny_prompts, write_tiny_llama

# NOTE: one thread: these models are tiny, and OpenMP barriers on a shared, loaded CPU cost
# far more than they give.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def prompts():
    """12 token-id prompts, 3 to 40 tokens long."""
    return tiny_prompts(12)


class HFReference:
    """Greedy continuations from `transformers` on the same folder, one prompt at a time
    (no padding), cached per (dtype, prompt, n)."""

    def __init__(self):
        self.models = {}
        self.cache = {}

    def greedy(self, path, prompt, n, dtype=torch.float32):
        from transformers import AutoModelForCausalLM

        key = (str(path), dtype, tuple(prompt), n)
        if key not in self.cache:
            mkey = (str(path), dtype)
            if mkey not in self.models:
                self.models[mkey] = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
            with torch.inference_mode():
                out = self.models[mkey].generate(torch.tensor([prompt]), max_new_tokens=n,
                                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            self.cache[key] = out[0, len(prompt):].tolist()
        return self.cache[key]


@pytest.fixture(scope="session")
def hf_ref():
    return HFReference()
