"""The leader's side of a tensor-parallel group: it starts ranks 1..N-1 and watches them.

    leader (rank 0: the engine, the scheduler, Kafka)      follower r = 1..N-1
      TCPStore on 127.0.0.1:<free port>   <-------------   joins it, says ready
      pipe r (write end)                  ------------->   reads messages (handoff.py)
      collectives: NCCL on CUDA, gloo on CPU  <-------->   the same, in the same order

Followers are fresh interpreters (`python -m inflight.engine.parallel.worker_proc`, not a
fork of this process: no engine state is copied or pickled; their arguments are a few
numbers on the command line and LOAD's JSON). Rank r runs on cuda:(i + r) for a leader on
cuda:i (indices within CUDA_VISIBLE_DEVICES), on the CPU for a CPU leader.

NOTE: no rank outlives the leader. A follower exits when (a) its pipe reaches end of file:
the leader process is gone, however it died (the kernel closes its descriptors, kill -9
included), or closed the group; (b) a collective fails (gloo reports a peer that hung
up); (c) its watchdog thread sees its parent pid change (a leader that died while the
follower was inside a stuck NCCL call). PR_SET_PDEATHSIG is not used: it fires when the
*thread* that started the child exits, and an engine may be built on a thread that ends
before the process does. The other way round, the leader's watchdog aborts the group
when a follower exits unasked, so a step fails with `TensorParallelError` (an
`EngineDeadError`: the worker stops, its requests are redone) instead of hanging.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import subprocess
import sys
import threading
import time
import weakref

import torch
import torch.distributed as dist

from inflight.engine.errors import ConfigError
from inflight.engine.parallel import handoff
from inflight.engine.parallel.group import Group, TensorParallelError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # every follower joined (its interpreter and torch imported) by then
WATCH_EVERY_S = 0.5


def rank_device(leader: torch.device, rank: int) -> torch.device:
    return leader if leader.type == "cpu" else torch.device("cuda", leader.index + rank)


class TensorParallelGroup:
    """Ranks 1..world-1 as processes, their pipes, and rank 0's `Group`. An engine starts
    one (and closes it); a group may also host engines one after another (tests,
    benchmarks): each loads its model onto it and releases it when closed."""

    def __init__(self, world: int, device: torch.device, *, start_timeout: float = START_TIMEOUT_S):
        if world < 1:
            raise ConfigError(f"tensor_parallel_size={world} must be >= 1")
        self.world, self.device = world, device
        self.followers: list[subprocess.Popen] = []
        self._fds: list[int] = []
        self._closing = False
        self.owner: object | None = None  # the engine a release closes the group for
        if world == 1:
            self.group = Group.single()
            return
        if device.type == "cuda":
            count = torch.cuda.device_count()
            if device.index + world > count:
                raise ConfigError(f"tensor_parallel_size={world} on {device} needs cuda:{device.index}.."
                                  f"cuda:{device.index + world - 1}, but this process sees {count} "
                                  "CUDA device(s): give it more GPUs or start at a lower index")
        store = dist.TCPStore("127.0.0.1", 0, world, True,
                              timeout=datetime.timedelta(seconds=start_timeout), wait_for_workers=False)
        try:
            for rank in range(1, world):
                self._spawn(rank, store.port)
            self._wait_ready(store, start_timeout)
            self.group = Group.join(store, 0, world, device)
        except BaseException:
            self.close()
            raise
        # a leader that forgets close() still reaps its followers at exit
        weakref.finalize(self, _shutdown, self._fds, self.followers)
        threading.Thread(target=self._watch, name="tp-watchdog", daemon=True).start()
        log.info("tensor-parallel group of %d started (%s): follower pids %s", world,
                 self.group.backend, [p.pid for p in self.followers])

    # -- start-up ------------------------------------------------------------------------
    def _spawn(self, rank: int, port: int) -> None:
        rfd, wfd = os.pipe()  # both ends non-inheritable; pass_fds hands the child its read end
        cmd = [sys.executable, "-m", "inflight.engine.parallel.worker_proc", "--rank", str(rank),
               "--world", str(self.world), "--port", str(port), "--fd", str(rfd),
               "--leader-pid", str(os.getpid()), "--device", str(rank_device(self.device, rank))]
        try:
            proc = subprocess.Popen(cmd, pass_fds=(rfd,), stdin=subprocess.DEVNULL)
        finally:
            os.close(rfd)
        self.followers.append(proc)
        self._fds.append(wfd)

    def _wait_ready(self, store: dist.TCPStore, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        keys = [f"ready{r}" for r in range(1, self.world)]
        while not store.check(keys):
            for rank, proc in enumerate(self.followers, 1):
                if proc.poll() is not None:
                    raise TensorParallelError(f"tensor-parallel rank {rank} (pid {proc.pid}) exited "
                                              f"with code {proc.returncode} while starting: see its log")
            if time.monotonic() > deadline:
                raise TensorParallelError(f"tensor-parallel followers did not start within {timeout:.0f}s")
            time.sleep(0.02)

    # -- messages ------------------------------------------------------------------------
    def send(self, cmd: int, *args: int, extra: bytes = b"") -> None:
        """One message to every follower."""
        if self.group.failed is not None:
            raise TensorParallelError(self.group.failed)
        msg = handoff.encode(cmd, *args, extra=extra)
        for rank, fd in enumerate(self._fds, 1):
            try:
                os.write(fd, msg)
            except OSError as exc:
                raise TensorParallelError(f"tensor-parallel rank {rank} is gone ({exc}): "
                                          f"cannot send {handoff.NAMES[cmd]}") from exc

    @contextlib.contextmanager
    def all_ranks(self, what: str):
        """Run the body here while the followers run theirs; then every rank learns whether
        all succeeded (one all-reduce), so none is left waiting in a collective."""
        ok = True
        try:
            yield
        except BaseException:
            ok = False
            raise
        finally:
            failed = self.status(ok)
            if ok and failed:
                raise TensorParallelError(f"{what} failed on {failed} other tensor-parallel rank(s): "
                                          "see their log")

    def status(self, ok: bool) -> int:
        """How many ranks report failure (this one included when not `ok`)."""
        if self.world == 1:
            return int(not ok)
        flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=self.device)
        return int(self.group.all_reduce(flag).item())

    # -- the end -------------------------------------------------------------------------
    def release(self) -> None:
        """The engine on this group is done: close the group if the engine owns it, else
        free the followers' shard for the next one."""
        if self.owner is not None:
            self.close()
        elif self.followers and not self._closing and self.group.failed is None:
            with contextlib.suppress(TensorParallelError):
                self.send(handoff.UNLOAD)

    def close(self, timeout: float = 10.0) -> None:
        """Tell the followers to exit and wait for them (killing what does not)."""
        if self._closing:
            return
        self._closing = True
        _shutdown(self._fds, self.followers, timeout)

    def _watch(self) -> None:
        while not self._closing:
            for rank, proc in enumerate(self.followers, 1):
                if proc.poll() is not None and not self._closing:
                    reason = (f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code "
                              f"{proc.returncode}: the engine cannot step again")
                    log.error("%s", reason)
                    self.group.abort(reason)
                    return
            time.sleep(WATCH_EVERY_S)


def _shutdown(fds: list[int], procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
    exit_msg = handoff.encode(handoff.EXIT)
    for fd in fds:
        with contextlib.suppress(OSError):
            os.write(fd, exit_msg)
        with contextlib.suppress(OSError):
            os.close(fd)  # end of file: a follower inside a step exits after it
    fds.clear()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
