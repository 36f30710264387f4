"""The profiling step: the largest step the scheduler can produce, run once through the
model runner's own launch/result path on a throw-away KV cache, to measure its memory peak
before the real KV cache is sized (engine/kv_sizing.py).

    requests   min(max_num_seqs, max_num_batched_tokens) of them, each a fresh prefill
    tokens     max_num_batched_tokens in all: one token each, the rest to the first ones
               (each at most max_model_len - 1: a prompt leaves room for one output token)
    sampling   every request samples: temperature, top-k and top-p (one sort over the
               vocabulary per row), logprobs=MAX_LOGPROBS
    prompts    prompt_logprobs=MAX_LOGPROBS: every prompt row goes through the LM head in
               the pieces a prompt-logprob step takes

NOTE: the runner is left as it was: its rows are freed (in reverse, so the free-row stack
is back in order), its default generator's state is restored (seeded runs draw the same
numbers as without profiling), and its launch/result order is kept (one launch, one result).
"""

from __future__ import annotations

from inflight.engine.kv_sizing import MemoryProbe
from inflight.engine.model_runner import ModelRunner
from inflight.engine.request import Request
from inflight.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from inflight.engine.scheduler import SchedulerOutput


def profile_lengths(num_tokens: int, num_seqs: int, max_model_len: int) -> list[int]:
    """Prompt lengths of the profiling step (see the module docstring)."""
    n = max(1, min(num_seqs, num_tokens))
    cap = max(1, max_model_len - 1)
    lengths = [1] * n
    rest = num_tokens - n
    for i in range(n):
        if rest <= 0:
            break
        add = min(rest, cap - 1)
        lengths[i] += add
        rest -= add
    return lengths


def profile_batch(lengths: list[int], block_size: int) -> tuple[SchedulerOutput, int]:
    """Dummy requests of these prompt lengths, each holding its own blocks; returns the
    step and the number of blocks it needs (its throw-away KV cache)."""
    params = SamplingParams(max_tokens=1, temperature=1.0, top_k=50, top_p=0.9, ignore_eos=True,
                            logprobs=MAX_LOGPROBS, prompt_logprobs=MAX_LOGPROBS)
    sched = SchedulerOutput()
    next_block = 0
    for i, n in enumerate(lengths):
        req = Request(f"profile-{i}", [0] * n, params)
        nb = -(-n // block_size)
        req.block_ids = list(range(next_block, next_block + nb))
        next_block += nb
        sched.requests.append(req)
        sched.num_tokens.append(n)
    return sched, next_block


def run_profile_step(runner: ModelRunner, sched: SchedulerOutput) -> None:
    """Launch and finish `sched` on the runner, then leave the runner as it was."""
    state = runner.generator.get_state()
    try:
        runner.result(runner.launch(sched))
    finally:
        for req in reversed(sched.requests):
            runner.remove(req)
        runner.generator.set_state(state)


def run_padded_decode(runner: ModelRunner) -> None:
    """One padded decode step at the largest graph size, eagerly, on padding rows (what a
    captured graph's memory pool holds)."""
    graphs = runner.graphs
    graphs.clear_inputs(runner.batch.pad_row)
    graphs.body(graphs.inputs[:, :graphs.sizes[-1]])


def profile_memory(runner: ModelRunner, probe: MemoryProbe, lengths: list[int],
                   graphs: bool) -> tuple[int, int]:
    """(peak activations of the profiling step, bytes to keep for the CUDA-graph pool or
    0 without `graphs`), on a throw-away KV cache that is freed again, caches handed back."""
    sched, num_blocks = profile_batch(lengths, runner.block_size)
    runner.allocate_kv_cache(num_blocks)
    try:
        probe.reset_peak()
        base = probe.snapshot().allocated
        run_profile_step(runner, sched)
        activations = max(0, probe.peak_allocated() - base)
        pool = 0
        if graphs:
            probe.reset_peak()
            base = probe.snapshot().allocated
            run_padded_decode(runner)
            static_logits = runner.graphs.sizes[-1] * runner.vocab_size * 4  # fp32, outside the pool
            pool = max(0, probe.peak_allocated() - base) + static_logits
    finally:
        runner.free_kv_cache()
        probe.release()
    return activations, pool
