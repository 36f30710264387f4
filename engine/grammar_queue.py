"""Constrained requests waiting for their grammar, outside the scheduler's queue.

    grammars.submit(req)                 # add_request: the compile goes to the pool
    compiled, failed = grammars.take_ready()   # each step: never waits
    grammars.discard(req)                # aborted while compiling

NOTE: a request whose grammar is still compiling is not in the scheduler at all, so no step
ever waits for a compile; it joins the waiting queue (by priority and arrival, as any other)
once its compile is done. The grammar engine (engine/grammar.py, llguidance) is imported
with the first constrained request only.
"""

from __future__ import annotations

import concurrent.futures
import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING

from inflight.engine.errors import ERR_ENGINE, ERR_INVALID_SCHEMA
from inflight.engine.request import Request

if TYPE_CHECKING:
    from inflight.engine.grammar import GrammarCompiler
    from inflight.engine.model_runner import ModelRunner
    from inflight.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

NAP_S = 0.005  # an engine with only compiles in flight looks again this often


class GrammarQueue:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, runner: ModelRunner):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._runner = runner
        self._compiler: GrammarCompiler | None = None  # on first use
        self.waiting: list[Request] = []
        self._futures: dict[Request, Future] = {}  # each waiting request's compile

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            from inflight.engine.grammar import GrammarCompiler

            self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size,
                                             self._tokenizer.eos_token_ids)
            self._runner.enable_structured_outputs(self._compiler)
        return self._compiler

    def submit(self, req: Request) -> None:
        so = req.params.structured_outputs
        self._futures[req] = self.compiler.submit(so.kind, so.key)
        self.waiting.append(req)

    def discard(self, req: Request) -> None:
        if self._futures.pop(req, None) is not None:
            self.waiting.remove(req)

    def take_ready(self) -> tuple[list[Request], list[tuple[Request, str, str]]]:
        """(requests whose grammar is ready, with their matcher set; (request, message,
        error code) of those whose compile failed). Compiles still running stay."""
        from inflight.engine.grammar import GrammarError, GrammarMatcher

        ready, failed, still = [], [], []
        for req in self.waiting:
            fut = self._futures[req]
            if not fut.done():
                still.append(req)
                continue
            del self._futures[req]
            try:
                req.grammar = GrammarMatcher(fut.result())
            except GrammarError as exc:
                failed.append((req, f"structured_outputs.{req.params.structured_outputs.kind} does "
                               f"not compile for this model's tokenizer: {exc}", ERR_INVALID_SCHEMA))
                continue
            except Exception as exc:  # noqa: BLE001 - one compile must not stop the engine
                log.exception("grammar compile failed")
                failed.append((req, f"the grammar compile failed: {exc!r}", ERR_ENGINE))
                continue
            ready.append(req)
        self.waiting = still
        return ready, failed

    def nap(self) -> None:
        """Nothing to run but compiles in flight: wait a moment for one (only ever when no
        request could step), rather than spin the caller's loop."""
        concurrent.futures.wait(list(self._futures.values()), timeout=NAP_S,
                                return_when=concurrent.futures.FIRST_COMPLETED)

    def stats(self) -> dict:
        g, masks = self._compiler, self._runner.bitmasks
        return {"grammar_compiling": len(self.waiting),
                "grammar_compiles": g.compiles if g else 0,
                "grammar_cache_hits": g.cache_hits if g else 0,
                "grammar_compile_s": g.compile_s if g else 0.0,
                "grammar_masks": masks.rows if masks else 0,
                "grammar_mask_host_s": masks.host_s if masks else 0.0}
