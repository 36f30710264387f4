"""Where each input of one step sits in its packed int32 buffer (one host-to-device copy).

The model runner writes a step's small inputs into one host buffer (engine/staging.py)
and reads them back on the device as views; both sides take every offset from one
`StepLayout`, whose fields are the buffer's regions in order:

    rows | seq_lens | ids | src | qsl | diffs | temperature | top_k | top_p |
    logprob_rows | prompt_rows | prompt_targets | spec | draft_rows | lora_slots

A region that a step does not use is empty (size 0), so it costs nothing. A padded decode
step (engine/cuda_graphs.py) has P rows in rows/seq_lens/ids/src, back to back from offset
0, which is the [4, P] block its static buffers take in one copy. A new input is one more
field here (its place in the order) and its size where the runner builds the layout.
`layout_of` is the mechanism, for any other packed copy too (a draft model's proposal:
engine/spec/draft.py).
"""

from __future__ import annotations

from typing import NamedTuple


def layout_of(cls, **sizes: int):
    """The regions of a layout class (a NamedTuple: `size`, then one slice per region)
    laid out in field order, each of the given size (absent: empty)."""
    at, matched, regions = 0, 0, []
    for name in cls._fields[1:]:
        n = sizes.get(name)
        if n is None:
            regions.append(slice(at, at))
        else:
            matched += 1
            regions.append(slice(at, at + n))
            at += n
    if matched != len(sizes):
        raise TypeError(f"{cls.__name__} has no region(s) {sorted(set(sizes) - set(cls._fields))}")
    return cls(at, *regions)


def region_len(region: slice) -> int:
    return region.stop - region.start


class StepLayout(NamedTuple):
    """Immutable, and cheap to build (a tuple): one per step."""

    size: int                 # elements in all
    rows: slice               # [L] each request's row in the InputBatch (then pad rows)
    seq_lens: slice           # [L] computed tokens once the step is done (then 0)
    ids: slice                # [TL] input token ids (then 0)
    src: slice                # [TL] -1, or the token's place in the last step's sampled ids
    qsl: slice                # [n + 1] query_start_loc (empty in a padded decode step)
    diffs: slice              # [3 x D] block-table updates: rows | columns | block ids
    temperature: slice        # [n] fp32 bits, when some row samples randomly
    top_k: slice              # [n] (vocab size = off), when some random row uses top-k
    top_p: slice              # [n] fp32 bits, when some random row uses top-p
    logprob_rows: slice       # logits rows whose sampled token's logprobs were asked for
    prompt_rows: slice        # [R] token rows that score a prompt token (prompt logprobs)
    prompt_targets: slice     # [R] the prompt token each of those rows scores
    spec: slice               # a verification's rows | vidx | drafts (engine/spec/layout.py)
    draft_rows: slice         # [n] each request's row in a draft model's q (sampled drafts)
    lora_slots: slice         # [T] each token's LoRA slot (-1: none), for the LoRA kernel

    of = classmethod(layout_of)
