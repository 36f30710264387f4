"""`--device cuda:auto`: each worker on a host claims GPUs of its own (N with tensor parallelism).

`docker compose up --scale worker=N` starts N identical replicas; Docker gives each the
same device request, so with `count: 1` they would all land on GPU 0. Instead every
replica sees all GPUs and takes an exclusive `flock` on `<lock_dir>/gpu<i>.lock` for the
GPUs nobody holds. The lock dir is a volume shared by the replicas of one host.

A worker of `tensor_parallel_size` N claims N GPUs: the first free aligned block
i*N .. i*N + N-1 (rank r on GPU i*N + r; aligned blocks keep pairs of NVLink-/PCIe-switch
neighbours together on the usual 2/4/8-GPU hosts). A host of G GPUs serves G // N such
workers.

NOTE: the locks live as long as the returned claim stays open; the kernel drops them when
the process dies in any way (kill -9 included), so a restarted worker finds its GPUs free
again. Nothing is written into the files: only the lock matters.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import IO

from inflight.schemas.errors import ConfigError

log = logging.getLogger("inflight.gpu_claim")

AUTO = "cuda:auto"


class GpuClaim:
    """The open lock files of a worker's GPUs (held until `close()` or the process ends)."""

    def __init__(self, first: int, handles: list[IO]):
        self.first, self.handles = first, handles

    @property
    def name(self) -> str:
        return ", ".join(h.name for h in self.handles)

    def close(self) -> None:
        for h in self.handles:
            h.close()


def claim_gpu(lock_dir: str | os.PathLike, num_gpus: int, count: int = 1) -> tuple[int, GpuClaim]:
    """Index of the first GPU of the first unclaimed aligned block of `count` GPUs, and the
    claim that holds it."""
    if num_gpus < 1:
        raise ConfigError("--device cuda:auto found no CUDA device: give the container a GPU "
                          "(compose: deploy.resources.reservations.devices) or run with --device cpu")
    if count > num_gpus:
        raise ConfigError(f"--device cuda:auto with tensor_parallel_size={count} needs {count} GPUs "
                          f"per worker, but this host shows {num_gpus}: lower the size or give the "
                          "container more GPUs")
    folder = Path(lock_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for first in range(0, num_gpus - count + 1, count):
        held: list[IO] = []
        for index in range(first, first + count):
            handle = open(folder / f"gpu{index}.lock", "a+")  # noqa: SIM115 - held for the process's life
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                break
            held.append(handle)
        if len(held) == count:
            claim = GpuClaim(first, held)
            log.info("claimed GPU(s) %d..%d of %d (locks %s)", first, first + count - 1, num_gpus,
                     claim.name)
            return first, claim
        for h in held:
            h.close()
    workers = num_gpus // count
    per = "" if count == 1 else f" of {count} GPUs each"
    raise ConfigError(f"all {num_gpus} GPUs of this host are claimed by other workers (locks in "
                      f"{folder}): run at most {workers} workers{per} per host, or give each a fixed "
                      "--device cuda:N")
