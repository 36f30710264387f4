"""One machine's measured CPU verification-cost curve (engine/spec/verify_costs.json, with
how it was made), as test data for the adaptive draft length."""

from __future__ import annotations

import json

from inflight.engine.spec.verify_costs import DEFAULTS_FILE

_CPU = json.loads(DEFAULTS_FILE.read_text())["cpu"]
CPU_VERIFY_COSTS = tuple(_CPU["costs"])
CPU_VERIFY_COST_SLOPE = _CPU["slope"]
