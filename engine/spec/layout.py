"""Where a verification step's rows are: the host side of one step with drafts.

A request with k drafts puts k + 1 tokens into the flattened batch (its last token, then
the drafts) and needs logits at all of them; every other request needs its last row only:

    tokens (T)     | a0 | b0 b1 b2 b3 | c0 c1 |          b: 3 drafts, c: a prefill chunk
    logit rows (R) | a0 | b0 b1 b2 b3 | c1 |             R = n + sum(k)
    vidx [n, K+1]  a: 0 0 0 0   b: 1 2 3 4   c: 5 5 5 5   (row j of request i; padded
                                                         with its last row)
    drafts [n, K]  a: - - -     b: d d d     c: - - -     (-1 = none)

These go to the device inside the step's one staged copy (engine/staging.py).
"""

from __future__ import annotations

import numpy as np
import torch


class SpecLayout:
    def __init__(self, drafts: dict):
        self.drafts = drafts
        self.rows: list[int] = []       # logit rows, in token order
        self.first: list[int] = []      # each request's first logit row
        self.num: list[int] = []        # each request's drafts
        self.spec: list[tuple[int, list[int]]] = []  # (request position, drafts)

    def add(self, i: int, pos: int, n_tokens: int, spec: list[int] | None) -> None:
        """Request i's tokens start at `pos` (n_tokens of them), `spec` its drafts."""
        self.first.append(len(self.rows))
        if spec:
            self.rows.extend(range(pos, pos + n_tokens))
            self.num.append(len(spec))
            self.spec.append((i, spec))
        else:
            self.rows.append(pos + n_tokens - 1)
            self.num.append(0)

    @property
    def width(self) -> int:
        """K: the most drafts of any request."""
        return max(self.num)

    def size(self, n: int) -> int:
        return len(self.rows) + n * (2 * self.width + 1)

    def pack(self, buf: np.ndarray, o: int) -> int:
        """Write rows | vidx | drafts at buf[o:]; returns the offset after them."""
        n, K = len(self.first), self.width
        R = len(self.rows)
        buf[o:o + R] = self.rows
        o += R
        first = np.asarray(self.first, dtype=np.int32)
        num = np.asarray(self.num, dtype=np.int32)
        vidx = first[:, None] + np.minimum(np.arange(K + 1, dtype=np.int32)[None, :], num[:, None])
        buf[o:o + n * (K + 1)] = vidx.ravel()
        o += n * (K + 1)
        drafts = buf[o:o + n * K].reshape(n, K)
        drafts[:] = -1
        for i, spec in self.spec:
            drafts[i, :len(spec)] = spec
        return o + n * K

    def views(self, dev: torch.Tensor, o: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logit rows [R], vidx [n, K+1], drafts [n, K]) on the device, from offset o."""
        K, R = self.width, len(self.rows)
        rows = dev[o:o + R].long()
        o += R
        vidx = dev[o:o + n * (K + 1)].long().view(n, K + 1)
        o += n * (K + 1)
        return rows, vidx, dev[o:o + n * K].long().view(n, K)
