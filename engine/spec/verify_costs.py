"""What verifying d drafts costs on the device at hand, in plain decode steps (costs[d]).

The adaptive draft length (engine/spec/adaptive.py) weighs a request's expected accepted
drafts against costs[d]. The curve is the machine's, not the algorithm's: on one CPU
thread with SmolLM2-135M 1-2 drafts cost 5-12% more than a plain step and a third one
57% (up to 3 rows ride MKL's few-row matmul, more take oneDNN's), other models, thread
counts and devices differ. So unless `draft_token_cost` fixes a linear cost, an engine
with a `cache_dir` measures it once at start-up on its own runner:

    one dummy request with CONTEXT tokens in the KV cache (blocks nobody holds yet);
    the plain decode step (d = 0) and verifications of d drafts for d in POINTS up to k,
    ROUNDS rounds interleaved, the least wall time of each;
    costs[d] = t(d) / t(0), linear between measured points, never decreasing

and keeps the figures in `<cache_dir>/spec-verify-costs/<key>.json` (key: the model
folder, dtypes, device, torch threads, k, context, torch version), so a restart reads them;
the figures are logged either way. Delete the file to measure again.

NOTE: without a cache_dir the engine reads the documented curve of its device type from
verify_costs.json (one machine's measurement, with how it was made) instead of measuring
at every start: draft lengths follow the curve, and a seeded request's tokens follow its
draft lengths, so a curve re-measured (with its noise) at each start would make seeded
outputs differ from one engine to the next.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pathlib
import platform
import time
from typing import TYPE_CHECKING

import torch

from inflight.engine.request import Request
from inflight.engine.sampling_params import SamplingParams
from inflight.engine.scheduler import SchedulerOutput
from inflight.engine.spec.adaptive import extended_costs

if TYPE_CHECKING:
    from inflight.engine.model_runner import ModelRunner

log = logging.getLogger(__name__)

CONTEXT = 256  # tokens in the KV cache before the measured steps (shorter if the model's is)
POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # drafts measured, up to k
ROUNDS = 4
CACHE_FOLDER = "spec-verify-costs"


DEFAULTS_FILE = pathlib.Path(__file__).with_name("verify_costs.json")


def default_costs(device_type: str, k: int) -> list[float]:
    """costs[0..k] from the documented curve of this device type (verify_costs.json)."""
    curves = json.loads(DEFAULTS_FILE.read_text())
    curve = curves["cuda" if device_type == "cuda" else "cpu"]
    return extended_costs(k, curve["costs"], curve["slope"])


def calibrated_costs(runner: ModelRunner, k: int, num_blocks: int, *, model_id: str,
                     cache_dir: str | os.PathLike | None = None) -> list[float]:
    """costs[0..k] for this runner: read from the cache, else measured (and cached)."""
    context = min(CONTEXT, runner.model.max_model_len - k - 2, runner.max_num_batched_tokens,
                  num_blocks * runner.block_size - k - 1)
    if context < 1:
        raise ValueError(f"no room to calibrate verifications of {k} drafts: the KV cache "
                         f"({num_blocks} blocks) or the context is too small; set "
                         "speculative_config draft_token_cost instead")
    key = {"model": model_id, "dtype": str(runner.model.dtype), "kv_dtype": str(runner.model.kv_dtype),
           "device": device_name(runner.device), "threads": torch.get_num_threads(), "k": k,
           "context": context, "draft": runner.draft is not None, "torch": torch.__version__}
    path = None
    if cache_dir is not None:
        digest = hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=8).hexdigest()
        path = pathlib.Path(cache_dir) / CACHE_FOLDER / f"{digest}.json"
        costs = _read(path, key, k)
        if costs is not None:
            log.info("speculative verification costs (read from %s): %s", path, _fmt(costs))
            return costs
    t0 = time.perf_counter()
    costs = measure_costs(runner, k, context)
    log.info("speculative verification costs (measured in %.1f s, context %d, %d threads): %s",
             time.perf_counter() - t0, context, key["threads"], _fmt(costs))
    if path is not None:
        _write(path, key, costs)
    return costs


def measure_costs(runner: ModelRunner, k: int, context: int) -> list[float]:
    """costs[0..k] measured on `runner` (blocks 0.. must be free: nothing runs yet)."""
    vocab = runner.vocab_size
    req = Request("spec-verify-calibration", [(7 * t + 11) % vocab for t in range(context)],
                  SamplingParams(max_tokens=k + 1, temperature=0.0, ignore_eos=True))
    req.block_ids = list(range(-(-(context + k + 1) // runner.block_size)))
    state = runner.generator.get_state()
    try:
        _, (token,) = runner.execute(SchedulerOutput([req], [context]))  # the prefill
        req.all_token_ids.append(token)
        req.output_token_ids.append(token)
        req.num_computed_tokens = context  # the runner never moves it: each step is the same
        points = [0] + [d for d in POINTS if d < k] + [k]
        steps = {d: SchedulerOutput([req], [1 + d], spec_token_ids={req: [token] * d} if d else {})
                 for d in points}
        best = dict.fromkeys(points, math.inf)
        for _ in range(ROUNDS):
            for d in points:
                t = time.perf_counter()
                runner.execute(steps[d])
                best[d] = min(best[d], time.perf_counter() - t)
    finally:
        runner.remove(req)
        runner.generator.set_state(state)
    return interpolate({d: best[d] / best[0] for d in points}, k)


def interpolate(measured: dict[int, float], k: int) -> list[float]:
    """costs[0..k] from measured points (0 and k among them): linear between them, never
    below 1 or below an earlier cost (a slower few-draft step is the machine's noise)."""
    pts = sorted(measured)
    out = [1.0]
    for a, b in zip(pts, pts[1:]):
        for d in range(a + 1, b + 1):
            out.append(measured[a] + (measured[b] - measured[a]) * (d - a) / (b - a))
    for d in range(1, len(out)):
        out[d] = round(max(out[d], out[d - 1], 1.0), 4)
    return out


def model_identity(folder: str | os.PathLike) -> str:
    """The folder, and its files' sizes and times (a checkpoint rewritten in place is
    another model)."""
    folder = pathlib.Path(folder).resolve()
    files = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".safetensors"))
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return f"{folder} {hashlib.blake2b(repr(stats).encode(), digest_size=8).hexdigest()}"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.processor() or platform.machine()} x{os.cpu_count()}"


def _read(path: pathlib.Path, key: dict, k: int) -> list[float] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    costs = data.get("costs") if isinstance(data, dict) else None
    if data.get("key") != key or not isinstance(costs, list) or len(costs) != k + 1:
        return None
    return [float(c) for c in costs]


def _write(path: pathlib.Path, key: dict, costs: list[float]) -> None:
    """Atomically (two engines starting at once each write a whole file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "costs": costs, "measured_at": time.time()}, indent=1))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache costs a measurement per start, nothing else
        log.warning("could not keep the verification costs in %s: %s", path, exc)


def _fmt(costs: list[float]) -> str:
    return " ".join(f"{d}:{c:.2f}" for d, c in enumerate(costs))
