"""The collectives of one tensor-parallel group: NCCL on CUDA, gloo on CPU.

A group is a torch.distributed backend built on its own TCPStore, not the process-global
default group: several groups may live in one process (tests start engines one after
another, each with its own followers), and nothing else in the process is touched.
At world size 1 every collective returns at once (the TP code path at TP=1 costs nothing).

`comm` counts what the collectives took on this rank (count, seconds) by kind; on CUDA the
NCCL calls return once queued, so the seconds there say nothing about the transfers.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from inflight.engine.errors import EngineDeadError

# NOTE: a follower waits for its next step on a pipe, never inside a collective, so an idle
# group hits no timeout; this bounds a collective whose peer hangs (loading a large
# checkpoint included: each rank joins the load's status all-reduce when done).
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=1)


class TensorParallelError(EngineDeadError):
    """A rank of the tensor-parallel group is gone or failed: the engine cannot step again."""


class Group:
    def __init__(self, rank: int, world: int, backend: str, pg=None, store=None):
        self.rank, self.world, self.backend = rank, world, backend
        self._pg, self._store = pg, store  # the store lives as long as the group (NCCL uses it late)
        self.comm: dict[str, list] = {"all_reduce": [0, 0.0], "gather": [0, 0.0], "broadcast": [0, 0.0]}
        self.failed: str | None = None

    @classmethod
    def single(cls) -> "Group":
        return cls(0, 1, "none")

    @classmethod
    def join(cls, store: dist.Store, rank: int, world: int, device: torch.device) -> "Group":
        """Build the backend for `rank` (blocks until every rank has joined)."""
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = COLLECTIVE_TIMEOUT
            return cls(rank, world, "nccl", dist.ProcessGroupNCCL(store, rank, world, opts), store)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = COLLECTIVE_TIMEOUT
        # every rank runs on this host: loopback, whatever the host name resolves to
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        return cls(rank, world, "gloo", dist.ProcessGroupGloo(store, rank, world, opts), store)

    # -- collectives ---------------------------------------------------------------------
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place; returns it."""
        if self.world == 1:
            return t
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        self._run("all_reduce", lambda: self._pg.allreduce([t], opts))
        return t

    def broadcast(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        if self.world == 1:
            return t
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._run("broadcast", lambda: self._pg.broadcast([t], opts))
        return t

    def gather(self, t: torch.Tensor, root: int = 0) -> list[torch.Tensor] | None:
        """Every rank's `t` (same shape) on `root`, in rank order; None elsewhere."""
        if self.world == 1:
            return [t]
        opts = dist.GatherOptions()
        opts.rootRank = root
        outs = [[torch.empty_like(t) for _ in range(self.world)]] if self.rank == root else []
        self._run("gather", lambda: self._pg.gather(outs, [t], opts))
        return outs[0] if outs else None

    def _run(self, kind: str, start) -> None:
        if self.failed is not None:
            raise TensorParallelError(self.failed)
        t0 = time.perf_counter()
        try:
            start().wait()
        except RuntimeError as exc:  # a peer died or hung up (gloo: connection closed)
            raise TensorParallelError(f"tensor-parallel {kind} failed on rank {self.rank} of "
                                      f"{self.world}: {exc}") from exc
        c = self.comm[kind]
        c[0] += 1
        c[1] += time.perf_counter() - t0

    def abort(self, reason: str) -> None:
        """Fail every collective from now on, and unblock one stuck in NCCL (another
        thread's: the leader's watchdog, when a follower process died)."""
        self.failed = reason
        if self._pg is not None and self.backend == "nccl":
            try:
                self._pg.abort()
            except RuntimeError:
                pass

    def reset_comm(self) -> None:
        for c in self.comm.values():
            c[0], c[1] = 0, 0.0
