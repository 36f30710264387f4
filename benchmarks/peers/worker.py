"""One system of benchmarks/cpu_peers.py in a process of its own, driven over stdin/stdout.

    python benchmarks/peers/worker.py SYSTEM PRECISION MODEL

SYSTEM: inflight | ctranslate2 | llama.cpp. Each runs in its own process so that its
threading runtime (torch's OpenMP, CTranslate2's bundled libgomp, ggml's thread pool)
is its alone, and so that its CPU time is its own. Commands and replies are JSON lines:

    {"op": "stream", "prompt": [ids], "tokens": n, "threads": t}
        -> {"tokens": [ids], "wall": [s per token], "cpu": [s per token]}
           (clock readings when each generated token was available: ms/token is the
           spread of the first and last over n - 1)
    {"op": "batch", "prompts": [[ids]...], "tokens": n, "threads": t}
        -> {"tokens": [[ids]...], "wall": s, "cpu": s}     (all submitted at once)
    {"op": "quit"}

Greedy decoding, end-of-sequence ignored, on every system. CPU time is the process's
(every thread of it). Nothing but replies goes to stdout (the systems' logs go to stderr).
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: common.py puts the repository on the path


def runner(system: str, precision: str, model: str):
    if system == "inflight":
        from engine_peer import EnginePeer

        return EnginePeer(model, precision)
    if system == "ctranslate2":
        from ct2_peer import CT2Peer

        return CT2Peer(model, precision)
    if system == "llama.cpp":
        from llama_peer import LlamaPeer

        return LlamaPeer(model, precision)
    raise SystemExit(f"unknown system {system!r}")


def main() -> None:
    system, precision, model = sys.argv[1:4]
    out = sys.stdout
    sys.stdout = sys.stderr  # a library's print never corrupts the replies
    peer = runner(system, precision, model)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        peer.threads(cmd["threads"])
        if cmd["op"] == "stream":
            reply = peer.stream(cmd["prompt"], cmd["tokens"])
        else:
            w, c = time.perf_counter(), time.process_time()
            tokens = peer.batch(cmd["prompts"], cmd["tokens"])
            reply = {"tokens": tokens, "wall": time.perf_counter() - w, "cpu": time.process_time() - c}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
