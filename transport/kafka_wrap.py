"""Wrapping a kafka-python method once per process: the mechanism the record-parsing and
parked-records fixes (transport/kafka_records.py, transport/kafka_parked.py) share."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("inflight.kafka")


def wrap_method(owner: Any, name: str, wrap: Callable[[Any], Any], *, mark: str,
                changed: str, fits: Callable[[], bool] = lambda: True) -> bool:
    """Replace `owner.<name>` by `wrap(original)`, once: the wrapper carries `mark`, and a
    method that carries it already is left alone. Where kafka-python no longer has the
    method (or `fits()` says its surroundings moved), log `changed` and return False."""
    original = getattr(owner, name, None)
    if original is None or not fits():
        log.warning(changed)
        return False
    if getattr(original, mark, False):
        return True
    wrapper = wrap(original)
    setattr(wrapper, mark, True)
    setattr(owner, name, wrapper)
    return True
