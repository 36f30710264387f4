"""`--device cuda:auto`: each worker on a host claims a GPU of its own.

`docker compose up --scale worker=N` starts N identical replicas; Docker gives each the
same device request, so with `count: 1` they would all land on GPU 0. Instead every
replica sees all GPUs and takes an exclusive `flock` on `<lock_dir>/gpu<i>.lock` for the
first GPU nobody holds. The lock dir is a volume shared by the replicas of one host.

NOTE: the lock lives as long as the returned file object stays open; the kernel drops it
when the process dies in any way (kill -9 included), so a restarted worker finds its GPU
free again. Nothing is written into the files: only the lock matters.
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


def claim_gpu(lock_dir: str | os.PathLike, num_gpus: int) -> tuple[int, IO]:
    """Index of the first unclaimed GPU and the open lock file that holds the claim."""
    if num_gpus < 1:
        raise ConfigError("--device cuda:auto found no CUDA device: give the container a GPU "
                          "(compose: deploy.resources.reservations.devices) or run with --device cpu")
    folder = Path(lock_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(num_gpus):
        handle = open(folder / f"gpu{index}.lock", "a+")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        log.info("claimed GPU %d of %d (lock %s)", index, num_gpus, handle.name)
        return index, handle
    raise ConfigError(f"all {num_gpus} GPUs of this host are claimed by other workers (locks in "
                      f"{folder}): run at most {num_gpus} workers per host, or give each a fixed "
                      "--device cuda:N")
