"""A worker process whose engine steps are slowed by a few ms, so runs overlap a Tansu group
join (about half the session timeout): the group-recovery rounds start these.

    python -m tests.consumers.slow_worker --model PATH --step-ms 10   (settings: INFLIGHT_*)
"""

from __future__ import annotations

import argparse
import logging
import time


def main(argv: list[str] | None = None) -> int:
    from inflight.consumers.worker import run_worker
    from inflight.engine import Engine, EngineConfig
    from inflight.schemas import Settings

    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--step-ms", type=float, default=10.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    settings = Settings()
    engine = Engine(EngineConfig(model=args.model, num_kv_blocks=512,
                                 max_num_seqs=settings.worker_max_inflight))
    step, delay = engine.step, args.step_ms / 1000.0
    engine.step = lambda: (time.sleep(delay), step())[1]
    return run_worker(settings, engine)


if __name__ == "__main__":
    raise SystemExit(main())
