"""What the leader tells its followers, and how a step's inputs travel.

Each follower reads its own pipe from the leader. A message is a fixed header

    cmd, a0 .. a5, n        8 little-endian int64;  n bytes follow (LOAD's JSON only)

    LOAD    JSON {folder, dtype, max_model_len, kernels}: build this rank's shard
    ALLOC   a0 blocks of a1 tokens: (re)allocate the KV cache
    FORWARD a0..a3 = T, B, W, R: one step, logits of all R rows (the usual step)
    HIDDEN  the same, hidden states only (kept for the LOGITS pieces that follow)
    LOGITS  a0, a1 = first row, rows: an LM-head piece of the kept hidden states
    UNLOAD  drop the model and its KV cache
    EXIT    leave

A step's tensors follow its header in ONE broadcast from rank 0 (below): the header gives
their sizes, so the payload is exactly as long as the step. Nothing per layer: inside the
forward there are only the model's own all-reduces. The pipe is also how a follower learns
that the leader is gone: end of file (the leader's process exited, kill -9 included).

    payload (int32):  ids [T] | positions [T] | slots [T] | block_tables [B * W] |
                      seq_lens [B] | query_start_loc [B + 1] | rows [R]

NOTE: the payload is built on the leader's device from the tensors the forward receives,
so input ids that exist only on the device (overlapped steps feed the last step's
samples) travel without a host round trip.
"""

from __future__ import annotations

import os
import struct

import torch

from inflight.engine.model import AttentionMetadata

LOAD, ALLOC, FORWARD, HIDDEN, LOGITS, UNLOAD, EXIT = range(1, 8)
NAMES = {LOAD: "LOAD", ALLOC: "ALLOC", FORWARD: "FORWARD", HIDDEN: "HIDDEN", LOGITS: "LOGITS",
         UNLOAD: "UNLOAD", EXIT: "EXIT"}
HEADER = struct.Struct("<8q")


def encode(cmd: int, *args: int, extra: bytes = b"") -> bytes:
    a = list(args) + [0] * (6 - len(args))
    return HEADER.pack(cmd, *a, len(extra)) + extra


def read_message(fd: int) -> tuple[int, tuple[int, ...], bytes] | None:
    """The next message on `fd`; None at end of file (the leader is gone)."""
    head = _read_exact(fd, HEADER.size)
    if head is None:
        return None
    cmd, *args, n = HEADER.unpack(head)
    extra = _read_exact(fd, n) if n else b""
    if extra is None:
        return None
    return cmd, tuple(args), extra


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def step_sizes(input_ids: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor) -> tuple[int, ...]:
    B, W = meta.block_tables.shape
    return input_ids.shape[0], B, W, rows.shape[0]


def pack_step(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
              rows: torch.Tensor) -> torch.Tensor:
    i32 = torch.int32
    return torch.cat([input_ids.to(i32), positions.to(i32), meta.slot_mapping.to(i32),
                      meta.block_tables.reshape(-1).to(i32), meta.seq_lens.to(i32),
                      meta.query_start_loc.to(i32), rows.to(i32)])


def payload_size(T: int, B: int, W: int, R: int) -> int:
    return 3 * T + B * W + 2 * B + 1 + R


def unpack_step(buf: torch.Tensor, T: int, B: int, W: int, R: int):
    """-> (input_ids, positions, meta, rows), in the dtypes the model runner passes."""
    o = 0

    def cut(n: int) -> torch.Tensor:
        nonlocal o
        o += n
        return buf[o - n:o]

    ids, pos, slots = cut(T).long(), cut(T).long(), cut(T).long()
    tables = cut(B * W).view(B, W)
    seq_lens, qsl = cut(B), cut(B + 1)
    rows = cut(R).long()
    return ids, pos, AttentionMetadata(slot_mapping=slots, block_tables=tables, seq_lens=seq_lens,
                                       query_start_loc=qsl), rows
