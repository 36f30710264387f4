"""Constrained decoding with llguidance: compile a request's `structured_outputs` off the
engine thread, then match its output token by token and say which tokens may come next.

    compiler = GrammarCompiler(tokenizer, vocab_size)     # one per engine
    future = compiler.submit(spec)                       # on the engine thread: never blocks
    ... future.done() ... matcher = GrammarMatcher(future.result())   # at admission
    fill_bitmasks([(matcher, row)], words)               # host: one bit per token, per row
    matcher.accept(token); matcher.is_terminated

Why llguidance (over xgrammar and outlines-core, all three on our index): it has no torch or
triton dependency (xgrammar pulls a newer triton than we pin), its compile is lazy (a JSON
schema is ready in well under a millisecond; the lexer is built as the output goes, so a
large schema never costs a long up-front compile), it computes a mask in tens of
microseconds on a 49k vocabulary, with a Rust thread pool for the whole batch, and it reads
the model's tokenizer.json as it is. Figures: docs/benchmarks.md (benchmarks/structured.py).

NOTE: compiles run in a small pool (`max_workers` threads; llguidance drops the GIL while it
builds a grammar); the engine thread only submits and, at its next steps, looks whether the
future is done. Compiled grammars are cached by (kind, canonical text): the cache holds a
template matcher in its initial state and each request gets a deep copy (microseconds). A
grammar that fails to compile is cached as its error too.

This module imports no torch (the wire's `structured_outputs.check` uses `validate`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

import llguidance
from llguidance import LLMatcher, LLTokenizer
from llguidance.gbnf_to_lark import any_to_lark

log = logging.getLogger(__name__)

# JSON output: fixed ", " / ": " separators and no other whitespace. A model then cannot
# spend its tokens on indentation (a random model would), and the text is what json.dumps
# writes. A schema may override it with llguidance's "x-guidance" key.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(Exception):
    """The grammar engine refused a constraint; the message is the compiler's."""


def grammar_text(kind: str, key: str) -> str:
    """An llguidance grammar for a constraint given as `StructuredOutputs.kind` / `.key`."""
    if kind == "json":
        return LLMatcher.grammar_from_json_schema(key, defaults=JSON_OPTIONS)
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(key)
    if kind == "choice":
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(key)))
    if kind == "grammar":
        return LLMatcher.grammar_from_lark(any_to_lark(key))
    if kind == "structural_tag":
        return LLMatcher.grammar_from_lark(structural_tag_lark(json.loads(key)))
    raise GrammarError(f"unknown constraint kind {kind!r}")


def structural_tag_lark(tag: dict[str, Any]) -> str:
    """A structural tag (see engine/structured_outputs.py) as a Lark grammar.

    Free text is one lexeme; a trigger ends it through a lazy lexeme (text up to the first
    occurrence of the trigger), after which only the rest of a `begin` that starts with it,
    the schema's JSON and `end` may follow (llguidance's StructTag construction)."""
    structures, triggers = tag["structures"], tag["triggers"]
    lines = ["%llguidance {}"]
    seg_names = []
    if tag.get("at_least_one"):
        for i, s in enumerate(structures):
            lines.append(f'seg_{i}: {_lit(s["begin"])} %json {_schema(s["schema"])} '
                         f'{_lit(s.get("end", ""))}')
            seg_names.append(f"seg_{i}")
        segs = " | ".join(seg_names)
        start = f"start: ({segs})" if tag.get("stop_after_first") else \
            f'start: ({segs}) ("\\n"? ({segs}))*'
    else:
        for k, trig in enumerate(triggers):
            lines.append(f"trig_{k}[lazy]: TAG_TEXT {_lit(trig)}")
        for i, s in enumerate(structures):
            k = next(k for k, t in enumerate(triggers) if s["begin"].startswith(t))
            rest = s["begin"][len(triggers[k]):]
            lines.append(f'seg_{i}: trig_{k} {_lit(rest)} %json {_schema(s["schema"])} '
                         f'{_lit(s.get("end", ""))}')
            seg_names.append(f"seg_{i}")
        segs = " | ".join(seg_names)
        start = f"start: TAG_TEXT | {segs}" if tag.get("stop_after_first") else \
            f"start: ({segs})* TAG_TEXT"
        lines.append("TAG_TEXT: /(.|\\n)*/")
    return "\n".join([lines[0], start, *lines[1:]]) + "\n"


def _schema(schema: dict[str, Any]) -> str:
    """A schema for Lark's %json, with our JSON whitespace (as JSON_OPTIONS) unless it says."""
    return json.dumps({"x-guidance": JSON_OPTIONS, **schema})


def _lit(text: str) -> str:
    return json.dumps(text) if text else ""


def validate(grammar: str) -> str:
    """"" when llguidance accepts the grammar (no tokenizer needed), else its message."""
    return LLMatcher.validate_grammar(grammar)


class GrammarMatcher:
    """One request's position in its grammar."""

    __slots__ = ("m", "terminated")

    def __init__(self, template: LLMatcher):
        self.m = template.deep_copy()
        self.terminated = False

    def accept(self, token: int) -> bool:
        """Consume a sampled token; False if the grammar refuses it (the mask forbade it:
        a bug). Afterwards `terminated` says whether the grammar is complete (only EOS
        could follow)."""
        m = self.m
        if not m.consume_token(token):
            return False
        self.terminated = m.is_stopped()
        return True

    def rollback(self, num_tokens: int) -> None:
        self.m.rollback(num_tokens)
        self.terminated = self.m.is_stopped()

    @property
    def error(self) -> str:
        return self.m.get_error()


class GrammarCompiler:
    """Compiles constraints for one tokenizer in a small thread pool, with a cache."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int], *,
                 max_workers: int = 2, cache_size: int = 512, mask_threads: int | None = None):
        self._hf = tokenizer.hf
        self.vocab_size = vocab_size
        self.eos = list(eos_token_ids)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="grammar")
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._tok: LLTokenizer | None = None
        self._mask_threads = mask_threads
        self._executor: llguidance.LLExecutor | None = None
        # counters (read by Engine.stats and benchmarks)
        self.compiles = 0
        self.cache_hits = 0
        self.compile_s = 0.0

    @property
    def tokenizer(self) -> LLTokenizer:
        """The llguidance view of the vocabulary (built once, on first use: ~0.3 s for 49k
        tokens, so it happens in the pool, with the first compile)."""
        with self._lock:
            if self._tok is None:
                n = max(self.vocab_size, self._hf.get_vocab_size())
                self._tok = LLTokenizer(self._hf.to_str(), n_vocab=n,
                                        eos_token=self.eos or None)
            return self._tok

    @property
    def executor(self) -> "llguidance.LLExecutor | None":
        """llguidance's pool for filling many masks at once; None on a machine with too few
        cores for a pool to pay (its default size, 80% of the CPUs, is one thread on two)."""
        if self._executor is None and self._mask_threads != 0:
            threads = self._mask_threads or int(0.8 * (os.cpu_count() or 1))
            if threads < 2:
                self._mask_threads = 0
                return None
            self._executor = llguidance.LLExecutor(min(threads, 32))
        return self._executor

    def submit(self, kind: str, key: str) -> Future:
        """A future of the compiled template (LLMatcher) for this constraint, or of its
        GrammarError. Call from one thread (the engine's)."""
        ck = (kind, key)
        fut = self._cache.get(ck)
        if fut is not None:
            self.cache_hits += 1
            self._cache.move_to_end(ck)
            return fut
        fut = self._pool.submit(self._compile, kind, key)
        self._cache[ck] = fut
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return fut

    def _compile(self, kind: str, key: str) -> LLMatcher:
        t0 = time.perf_counter()
        try:
            grammar = grammar_text(kind, key)
        except Exception as exc:  # noqa: BLE001 - the GBNF converter raises plain Exception
            raise GrammarError(str(exc) or type(exc).__name__) from None
        m = LLMatcher(self.tokenizer, grammar, log_level=0)
        self.compile_s += time.perf_counter() - t0
        self.compiles += 1
        if m.is_error():
            raise GrammarError(m.get_error())
        return m

    def words_per_row(self) -> int:
        """int32 words of one row's bitmask."""
        return (self.vocab_size + 31) // 32

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


PARALLEL_MIN_ROWS = 8  # fewer constrained rows than this: fill them on the calling thread


def fill_bitmasks(executor: "llguidance.LLExecutor | None", jobs: list[tuple[GrammarMatcher, int]],
                  ptr: int, words: int, rows: int) -> None:
    """Write each matcher's allowed-token bitmask into row `j` of the int32 array [rows,
    words] at address `ptr` (bit t of the row = token t allowed): in llguidance's thread
    pool for many rows, else here (a mask takes microseconds; a hand-off to another thread
    can cost more, on a loaded machine much more). Both drop the GIL."""
    if executor is None or len(jobs) < PARALLEL_MIN_ROWS:
        size = words * 4
        for g, j in jobs:
            g.m.unsafe_compute_mask_ptr(ptr + j * size, size)
        return
    executor.unsafe_compute_mask_ptr([(g.m, j) for g, j in jobs], ptr, words * 4, rows)
