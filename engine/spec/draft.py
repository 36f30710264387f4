"""A draft model: a smaller model of a supported architecture, sharing the target's
tokenizer, proposes k tokens with k cheap single-token forwards.

Its KV cache is its own tensors over the same block ids as the target's (one block table
per request serves both; a block costs the target's bytes plus the draft's). The model
runner runs the draft on every target forward's inputs (`ModelRunner._mirror`), so the
draft's K/V is valid exactly where the target's is: prefix-cache hits, preemption and the
roll-back after a verification need nothing of their own.

A proposal for a request with computed tokens C (its last token at position C):

    forward j = 0..k-1:  input  last token, d_1, ..., d_{k-1}  at positions C .. C+k-1
                         output d_1 .. d_k  (argmax, or sampled with the request's
                         temperature / top-k / top-p: then q_j is kept for rejection sampling)

It writes draft K/V at positions C..C+k-1, inside the slots the verification itself needs
(allocated here, before the scheduler places the request: `allocate_slots(req, 1 + k)`),
and the verification's mirror forward writes them again with the same tokens.
"""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np
import torch

from inflight.engine.errors import ConfigError
from inflight.engine.model import AttentionMetadata
from inflight.engine.request import Request
from inflight.engine.sampler import SamplingBatch
from inflight.engine.spec.config import SpeculativeConfig
from inflight.engine.spec.rejection import target_probs
from inflight.engine.step_layout import layout_of

if TYPE_CHECKING:
    from inflight.engine.kv_cache_manager import KVCacheManager
    from inflight.engine.model_runner import ModelRunner


def _vocab(folder: pathlib.Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"speculative_config model {folder} has no tokenizer.json: the draft "
                          "model must be a Hugging Face folder sharing the target's tokenizer")
    return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)


def load_draft_model(spec: SpeculativeConfig, target_folder: pathlib.Path, target, load: Callable):
    """The draft's weights (`load(path)` builds a model as the target was built), after
    checking that it can draft for `target`."""
    folder = pathlib.Path(spec.model)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"speculative_config model={spec.model!r} is not a model folder "
                          "(config.json, *.safetensors, tokenizer.json)")
    if _vocab(folder) != _vocab(pathlib.Path(target_folder)):
        raise ConfigError(f"speculative_config model {folder} has a different tokenizer from the "
                          f"target {target_folder}: a draft model must share the target's tokenizer "
                          "(its token ids are the target's); pick a model of the same family")
    draft_vocab = json.loads((folder / "config.json").read_text()).get("vocab_size")
    if draft_vocab != target.config.vocab_size:
        raise ConfigError(f"speculative_config model {folder} has vocab_size {draft_vocab}, the target "
                          f"{target.config.vocab_size}: the draft's logits must cover the same ids")
    draft = load(folder)
    if draft.max_model_len < target.max_model_len:
        raise ConfigError(f"the draft model's context ({draft.max_model_len}) is shorter than the "
                          f"engine's max_model_len ({target.max_model_len}): lower "
                          f"EngineConfig.max_model_len to {draft.max_model_len} or pick another draft")
    return draft


class ProposalLayout(NamedTuple):
    """The packed inputs of one proposal (B requests), in one staged copy."""

    size: int           # elements in all
    rows: slice         # [B] the requests' InputBatch rows
    starts: slice       # [B] their computed tokens: the first draft's position
    ids: slice          # [B] their last tokens
    limits: slice       # [B] drafts each may get
    temperature: slice  # [B] fp32 bits
    diffs: slice        # [3 x D] block-table updates (engine/input_batch.py)

    of = classmethod(layout_of)


class DraftProposer:
    def __init__(self, spec: SpeculativeConfig, runner: ModelRunner, kv: KVCacheManager):
        self.k = spec.num_speculative_tokens
        self.runner = runner
        self.kv = kv
        self.model = runner.draft
        self._probs: torch.Tensor | None = None   # [B, K, V] q of the last proposal (sampling rows)
        self._row: dict[Request, int] = {}        # request -> its row in _probs

    def finished(self, req: Request, completed: bool = True) -> None:
        self._row.pop(req, None)

    @torch.inference_mode()
    def propose(self, reqs: list[Request], limits: list[int]) -> list[list[int]]:
        # room for the verification's 1 + k tokens; a request that gets none drafts nothing
        room = [i for i, (r, lim) in enumerate(zip(reqs, limits)) if self.kv.allocate_slots(r, 1 + lim)]
        out: list[list[int]] = [[] for _ in reqs]
        self._probs, self._row = None, {}
        if not room:
            return out
        batch, runner = self.runner.batch, self.runner
        sel = [reqs[i] for i in room]
        lims = [limits[i] for i in room]
        B, K = len(sel), max(lims)
        rows = []
        for r in sel:
            row = batch.row_of[r]
            if len(r.block_ids) != batch.num_blocks[row]:
                batch.append_blocks(r, row)
            rows.append(row)
        width = max(batch.num_blocks[row] for row in rows)
        lay = ProposalLayout.of(rows=B, starts=B, ids=B, limits=B, temperature=B,
                                diffs=3 * batch.num_diff_entries)
        buf = runner.staging.host(lay.size)
        buf[lay.rows] = rows
        buf[lay.starts] = [r.num_computed_tokens for r in sel]
        buf[lay.ids] = [r.all_token_ids[-1] for r in sel]
        buf[lay.limits] = lims
        temps = np.asarray([r.params.temperature for r in sel], dtype=np.float32)
        buf[lay.temperature] = temps.view(np.int32)
        batch.take_diffs(buf[lay.diffs])
        dev = runner.staging.send(lay.size)
        batch.apply_diffs(dev[lay.diffs])
        start, ids, lim = dev[lay.starts].long(), dev[lay.ids].long(), dev[lay.limits].long()
        sampling = self._sampling(sel, dev[lay.temperature].view(torch.float32), temps)
        block_tables = batch.block_table_dev[dev[lay.rows].long(), :width]
        drafts, probs = self._run(ids, start, lim, block_tables, lims, sampling)
        if probs is not None:
            self._probs = probs
            self._row = {r: b for b, r in enumerate(sel)}
        for i, row, n in zip(room, drafts.tolist(), lims):
            out[i] = row[:n]
        return out

    def _sampling(self, reqs: list[Request], t_temp: torch.Tensor, temps: np.ndarray) -> SamplingBatch | None:
        if not temps.any():
            return None
        def col(vals, off):  # noqa: E306 - a per-request parameter as a device column
            return torch.tensor(vals, device=t_temp.device) if any(v != off for v in vals) else None
        top_k = col([r.params.top_k if r.params.uses_top_k else self.model.config.vocab_size for r in reqs],
                    self.model.config.vocab_size)
        top_p = col([float(r.params.top_p) for r in reqs], 1.0)
        return SamplingBatch(t_temp, top_k, top_p, [r.generator for r in reqs], False)

    def _run(self, ids, start, lim, block_tables, lims: list[int], sampling: SamplingBatch | None):
        """K = max(lims) draft forwards of B tokens; -> drafts [B, K], q [B, K, V] (when
        some row samples) or None. NOTE: a seeded row draws from its generator only for its
        own lims[b] drafts, so its draws do not depend on the rest of the batch."""
        runner, model = self.runner, self.model
        K = max(lims)
        B = ids.shape[0]
        bs = runner.block_size
        qsl = runner._arange32[:B + 1]
        rows = runner._arange64[:B]
        drafts, qs = [], []
        for j in range(K):
            live = j < lim
            # past its limit a row re-reads its last allowed position and writes nothing
            pos = start + torch.minimum(torch.full_like(lim, j), lim - 1)
            col = block_tables.gather(1, (pos // bs)[:, None])[:, 0].long()
            slots = torch.where(live, col * bs + pos % bs, -1)
            meta = AttentionMetadata(slot_mapping=slots, block_tables=block_tables,
                                     seq_lens=(pos + 1).to(torch.int32), query_start_loc=qsl)
            logits = model.forward(ids, pos, meta, runner.draft_kv_caches, rows)
            ids = logits.argmax(dim=-1)
            if sampling is not None:
                q = target_probs(logits[:, None], sampling)[:, 0]
                race = torch.empty_like(q).exponential_(generator=runner.generator)
                for b, gen in enumerate(sampling.generators):
                    if gen is not None and j < lims[b]:
                        race[b].exponential_(generator=gen)
                ids = torch.where(sampling.temperature == 0, ids, (q / race).argmax(dim=-1))
                qs.append(q)
            drafts.append(ids)
        return torch.stack(drafts, dim=1), (torch.stack(qs, dim=1) if qs else None)

    def prob_rows(self, requests: Sequence[Request], spec_token_ids: dict) -> list[int] | None:
        """Each of a verification step's requests' row in the last proposal's q (past the
        end, a zero row, for those without drafts), or None when that proposal sampled
        nothing (greedy drafts are point masses). The rows go to the device in the step's
        staged copy (StepLayout.draft_rows)."""
        if self._probs is None:
            return None
        pad = self._probs.shape[0]
        return [self._row.get(r, pad) if r in spec_token_ids else pad for r in requests]

    def draft_probs(self, rows: torch.Tensor, K: int) -> torch.Tensor:
        """q [n, K, V] of a verification step (`rows`: `prob_rows` on the device)."""
        probs = self._probs
        padded = torch.cat([probs, probs.new_zeros((1,) + probs.shape[1:])])
        return padded[rows][:, :K]
