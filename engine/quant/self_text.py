"""Calibration text the model writes itself: its answers to varied chat prompts.

The prompts (engine/quant/calibration_prompts.py) go through the model's own chat
template; the answers are sampled (seeded, so a run is reproducible on one machine) from
the unquantized model by the engine. Each sample is the whole conversation as the model
sees it at serving time, template tokens included:

    [system/user turn, templated] [the model's answer] [end-of-turn / EOS if it stopped]

As many prompts as the windows need (about TOKENS_PER_ANSWER tokens each; all of them for
the default 192 windows of 128 tokens), spread over the kinds. Samples are concatenated in
prompt order and cut into windows of `seq_len` tokens (a window may span two
conversations, as windows of a long text span two paragraphs). When one answer per prompt
is not enough, further rounds answer the prompts again with other seeds. A model folder
without a chat template answers the plain prompt text.
"""

from __future__ import annotations

import hashlib
import pathlib
import time
from dataclasses import dataclass
from typing import Callable

from inflight.engine.errors import ConfigError
from inflight.engine.quant.calibration_prompts import PROMPTS

MAX_TOKENS = 256       # per answer, at most
TEMPERATURE = 0.8      # sampled, not greedy: greedy answers of a small model loop
TOP_P = 0.95
MAX_ROUNDS = 8
TOKENS_PER_ANSWER = 200  # templated prompt + answer, on average (SmolLM2: ~265; some stop early)


def spread(items: tuple, k: int) -> list:
    """k items evenly spaced over `items` (the prompts are grouped by kind: a small
    calibration still gets stories, explanations, letters, dialogue and code)."""
    return [items[(j * len(items)) // k] for j in range(k)]


def _has_chat_template(eng) -> bool:
    from inflight.engine.errors import ModelError

    try:
        eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    except ModelError:
        return False
    return True


@dataclass(frozen=True)
class GeneratedText:
    windows: list[list[int]]
    info: dict  # provenance for config.json: prompts, answers, tokens, sampling, digest


_made: dict[tuple, GeneratedText] = {}  # one process quantizing a model twice generates once


def generate_windows(folder: str | pathlib.Path, num_windows: int, seq_len: int, *,
                     device: str = "cpu", dtype: str | None = None, seed: int = 0,
                     progress: Callable[[str], None] = print) -> GeneratedText:
    """`num_windows` windows of `seq_len` tokens of the model's own chat answers."""
    from inflight.engine import Engine, EngineConfig, SamplingParams

    if num_windows < 1:
        return GeneratedText([], {})
    dtype = dtype or ("bfloat16" if str(device).startswith("cuda") else "float32")
    weights = sorted(pathlib.Path(folder).glob("*.safetensors"))
    key = (str(pathlib.Path(folder).resolve()), tuple((f.name, f.stat().st_mtime_ns) for f in weights),
           num_windows, seq_len, str(device), dtype, seed)
    if key in _made:
        made = _made[key]
        return GeneratedText([list(w) for w in made.windows], dict(made.info))
    need = num_windows * seq_len
    t0 = time.monotonic()
    block = 16
    prompt_budget = 160  # templated prompt tokens, generous (the longest is ~70 on SmolLM2)
    blocks_per_seq = -(-(prompt_budget + MAX_TOKENS) // block)
    eng = Engine(EngineConfig(model=folder, dtype=dtype, device=device, seed=seed,
                              max_num_seqs=len(PROMPTS), block_size=block,
                              max_num_batched_tokens=max(2048, len(PROMPTS) * prompt_budget),
                              num_kv_blocks=len(PROMPTS) * blocks_per_seq + 1))
    picked = spread(PROMPTS, min(len(PROMPTS), -(-need // TOKENS_PER_ANSWER) + 1))
    chat = _has_chat_template(eng)
    max_tokens = min(MAX_TOKENS, -(-need // len(picked)))  # a small calibration needs short answers
    ids: list[int] = []
    answers = 0
    for rnd in range(MAX_ROUNDS):
        for i, prompt in enumerate(picked):
            p = SamplingParams(max_tokens=max_tokens, temperature=TEMPERATURE, top_p=TOP_P,
                               seed=seed + rnd * len(PROMPTS) + i)
            if chat:
                eng.add_request(f"calib-{rnd}-{i}", messages=[{"role": "user", "content": prompt}], params=p)
            else:
                eng.add_request(f"calib-{rnd}-{i}", prompt=prompt + "\n", params=p)
        finals = {}
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    finals[out.request_id] = out
        for i in range(len(picked)):
            out = finals[f"calib-{rnd}-{i}"]
            if out.finish_reason == "error":
                raise ConfigError(f"generating calibration text failed: {out.error}")
            ids += list(out.prompt_token_ids) + list(out.token_ids)
            answers += 1
        progress(f"calibration text: {answers} answers, {len(ids)} tokens "
                 f"({time.monotonic() - t0:.0f}s)")
        if len(ids) >= need:
            break
    else:
        raise ConfigError(f"the model's answers gave {len(ids)} tokens in {MAX_ROUNDS} rounds, "
                          f"{need} needed: lower --samples / --seq-len or give --calib FILE")
    windows = [ids[i * seq_len:(i + 1) * seq_len] for i in range(num_windows)]
    digest = hashlib.sha256(str([t for w in windows for t in w]).encode()).hexdigest()[:16]
    info = {"prompts": len(picked), "chat_template": chat, "answers": answers, "tokens": len(ids), "max_tokens": max_tokens,
            "temperature": TEMPERATURE, "top_p": TOP_P, "seed": seed, "dtype": dtype,
            "tokens_sha256_16": digest}
    _made[key] = GeneratedText(windows, info)
    return GeneratedText([list(w) for w in windows], dict(info))
