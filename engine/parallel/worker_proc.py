"""A follower rank: `python -m inflight.engine.parallel.worker_proc` (started by the leader,
engine/parallel/launch.py; never by hand).

It joins the group, then does what the leader's messages say (engine/parallel/handoff.py)
until EXIT or the pipe's end of file, and exits. Between steps it waits on the pipe, not
in a collective, so an idle group never times out. A failure here is logged and ends the
process: the leader's watchdog sees it and fails its engine's next step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from inflight.engine.config import DTYPES
from inflight.engine.parallel import handoff
from inflight.engine.parallel.group import Group
from inflight.engine.parallel.launch import START_TIMEOUT_S, WATCH_EVERY_S
from inflight.engine.parallel.sharded_model import ShardedModel
from inflight.kernels.kv_quant import KV_CACHE_DTYPES
from inflight.kernels.ops import get_ops

log = logging.getLogger("inflight.engine.parallel.follower")


class Follower:
    def __init__(self, group: Group, device: torch.device, fd: int):
        self.group, self.device, self.fd = group, device, fd
        self.model: ShardedModel | None = None
        self.kv_caches = None
        self.hidden: torch.Tensor | None = None

    @torch.inference_mode()
    def run(self) -> int:
        while True:
            msg = handoff.read_message(self.fd)
            if msg is None or msg[0] == handoff.EXIT:
                return 0
            cmd, args, extra = msg
            if cmd in (handoff.FORWARD, handoff.HIDDEN):
                self.step(cmd, *args[:4])
            elif cmd == handoff.LOGITS:
                first, n = args[:2]
                self.model.compute_logits(self.hidden[first:first + n])
            elif cmd == handoff.LOAD:
                self.load(json.loads(extra))
            elif cmd == handoff.ALLOC:
                self.allocate(*args[:2])
            elif cmd == handoff.UNLOAD:
                self.model = self.kv_caches = self.hidden = None
            else:
                raise RuntimeError(f"unknown message {cmd} from the leader")

    def step(self, cmd: int, T: int, B: int, W: int, R: int) -> None:
        buf = torch.empty(handoff.payload_size(T, B, W, R), dtype=torch.int32, device=self.device)
        self.group.broadcast(buf)
        ids, positions, meta, rows = handoff.unpack_step(buf, T, B, W, R)
        h = self.model.forward_hidden(ids, positions, meta, self.kv_caches, rows)
        if cmd == handoff.FORWARD:
            self.model.compute_logits(h)
            self.hidden = None
        else:
            self.hidden = h

    def load(self, spec: dict) -> None:
        self.model = self.kv_caches = self.hidden = None
        ok = True
        try:
            self.model = ShardedModel(spec["folder"], get_ops(spec["kernels"], str(self.device)),
                                      DTYPES[spec["dtype"]], self.device, spec["max_model_len"],
                                      KV_CACHE_DTYPES[spec["kv_cache_dtype"]], group=self.group)
        except Exception:  # noqa: BLE001 - reported to the leader through the status all-reduce
            log.exception("rank %d could not load %s", self.group.rank, spec["folder"])
            ok = False
        self._status(ok)

    def allocate(self, num_blocks: int, block_size: int) -> None:
        self.kv_caches = None  # the old (profiling) cache goes before the new one comes
        ok = True
        try:
            self.kv_caches = self.model.allocate_kv_cache(num_blocks, block_size)
        except Exception:  # noqa: BLE001
            log.exception("rank %d could not allocate %d KV blocks", self.group.rank, num_blocks)
            ok = False
        self._status(ok)

    def _status(self, ok: bool) -> None:
        flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=self.device)
        self.group.all_reduce(flag)


def watch_leader(leader_pid: int) -> None:
    """Exit as soon as the parent is no longer the leader (it died; see launch.py)."""
    def watch() -> None:
        while os.getppid() == leader_pid:
            time.sleep(WATCH_EVERY_S)
        os._exit(0)

    if os.getppid() != leader_pid:
        os._exit(0)
    threading.Thread(target=watch, name="leader-watchdog", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.engine.parallel.worker_proc")
    for name in ("rank", "world", "port", "fd", "leader-pid"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--device", required=True)
    args = p.parse_args(argv)
    watch_leader(args.leader_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the leader's to handle
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s rank{args.rank} %(name)s %(message)s")
    if "OMP_NUM_THREADS" not in os.environ:  # the ranks share this host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", args.port, args.world, False,
                          timeout=datetime.timedelta(seconds=START_TIMEOUT_S))
    store.set(f"ready{args.rank}", "1")
    group = Group.join(store, args.rank, args.world, device)
    try:
        return Follower(group, device, args.fd).run()
    except Exception:  # noqa: BLE001 - the leader learns of it from the exit
        log.exception("rank %d failed", args.rank)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
