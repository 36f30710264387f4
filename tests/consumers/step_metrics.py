"""EngineMetrics fed from whole steps, for tests that step an engine by hand (the worker's
publisher feeds observe_first / observe_finished / observe_tokens from its own pass over
each step, keeping the previous token's time on its per-request state)."""

from __future__ import annotations

from collections.abc import Iterable

from inflight.consumers.engine_metrics import EngineMetrics
from inflight.engine.outputs import RequestOutput


class StepMetrics(EngineMetrics):
    """EngineMetrics plus observe_outputs(step's outputs, when it returned)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last_token_at: dict[str, float] = {}

    def observe_outputs(self, outputs: Iterable[RequestOutput], now: float) -> None:
        """One step's RequestOutputs; `now` = when the step returned. The inter-token gaps
        are gathered by the previous token's time, as the publisher gathers them."""
        last = self._last_token_at
        tokens, gaps = 0, {}
        for out in outputs:
            rid = out.request_id
            n = len(out.new_token_ids)
            if n:
                tokens += n
                prev = last.get(rid)
                if prev is None:
                    last[rid] = self.observe_first(out, now)
                else:
                    gaps[prev] = gaps.get(prev, 0) + 1
                    last[rid] = now
            if out.finished:
                last.pop(rid, None)
                self.observe_finished(out)
        self.observe_tokens(tokens, gaps, now)
