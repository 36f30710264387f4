"""Triton LoRA shrink/expand against the torch references (interpreter on CPU), and the
engine's CPU path (slot groups) against the per-token definition."""

import pytest
import torch

from inflight.kernels.lora import lora_add_batched, lora_add_groups, lora_add_ref
from inflight.kernels.triton_lora import lora_add_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(T=9, K=24, N=40, S=3, C=12, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(dtype)
    y = torch.randn(T, N, generator=g).to(dtype)
    a = torch.randn(S, C, K, generator=g).to(dtype) / K ** 0.5
    b = torch.randn(S, C, N, generator=g).to(dtype) / C ** 0.5
    # base tokens (-1) between segments of slots 0..2, slot 1 in two places
    slots = torch.tensor([-1, 0, 0, 1, -1, 2, 2, 1, -1][:T], dtype=torch.int32)
    return [t.to(DEVICE) for t in (y, x, a, b, slots)]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_triton_matches_reference(dtype, tol):
    y, x, a, b, slots = _case(dtype=dtype)
    ref = lora_add_ref(y.clone(), x, a, b, slots)
    out = lora_add_triton(y.clone(), x, a, b, slots)
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    base = slots < 0
    assert torch.equal(out[base], y[base])  # base tokens untouched


def test_triton_odd_sizes_and_empty():
    y, x, a, b, slots = _case(T=5, K=33, N=70, S=2, C=5, seed=1)
    slots = torch.tensor([1, -1, 0, 0, 1], dtype=torch.int32, device=DEVICE)
    torch.testing.assert_close(lora_add_triton(y.clone(), x, a, b, slots),
                               lora_add_ref(y.clone(), x, a, b, slots), atol=1e-5, rtol=1e-5)
    e = torch.empty(0, 33, device=DEVICE)
    assert lora_add_triton(torch.empty(0, 70, device=DEVICE), e, a, b,
                           torch.empty(0, dtype=torch.int32, device=DEVICE)).shape == (0, 70)


def test_shapes_checked():
    y, x, a, b, slots = _case()
    with pytest.raises(ValueError, match="want \\[S, C, K\\]"):
        lora_add_triton(y, x, a[:, :, :-1], b, slots)


def test_groups_match_reference():
    y, x, a, b, slots = [t.cpu() for t in _case(seed=2)]
    # slot 0: contiguous (a slice); slot 1: two runs (an index); slot 2 uses only 7 columns
    a[2, 7:] = 0
    b[2, 7:] = 0
    groups = [(0, slice(1, 3)), (1, torch.tensor([3, 7])), (2, slice(5, 7))]
    out = lora_add_groups(y.clone(), x, a, b, groups, used=[12, 12, 7])
    torch.testing.assert_close(out, lora_add_ref(y.clone(), x, a, b, slots), atol=1e-5, rtol=1e-5)


def test_batched_runs_match_reference():
    """The CPU path's batched runs (engine/lora/slots.py plans them) against the per-token
    definition: interleaved slots, uneven counts (padded rows), base tokens between, a slot
    that uses fewer columns, and a run beside a lone slot served by groups."""
    from inflight.engine.lora.slots import LoraStep

    g = torch.Generator().manual_seed(3)
    S, C, K, N = 5, 12, 24, 40
    a = torch.randn(S, C, K, generator=g) / K ** 0.5
    b = torch.randn(S, C, N, generator=g) / C ** 0.5
    a[2, 7:] = 0
    b[2, 7:] = 0
    used = [12, 12, 7, 0, 12]
    # requests: (slot, tokens); slots 0-2 form a run, slot 4 stands alone
    reqs = [(0, 1), (-1, 1), (1, 1), (2, 1), (0, 1), (1, 2), (4, 1), (-1, 3), (2, 1)]
    slots_per_token = torch.tensor([s for s, k in reqs for _ in range(k)], dtype=torch.int32)
    T = slots_per_token.numel()
    x = torch.randn(T, K, generator=g)
    y = torch.randn(T, N, generator=g)
    step = LoraStep.plan([s for s, _ in reqs], [k for _, k in reqs], torch.device("cpu"))
    assert [(r.lo, r.hi) for r in step.runs] == [(0, 3)] and step.runs[0].mask is not None
    assert [s for s, _ in step.groups] == [4]
    out = y.clone()
    for run in step.runs:
        lora_add_batched(out, x, a, b, run.lo, run.hi, run.idx, run.mask, max(used[run.lo:run.hi]))
    lora_add_groups(out, x, a, b, step.groups, used)
    torch.testing.assert_close(out, lora_add_ref(y.clone(), x, a, b, slots_per_token), atol=1e-5, rtol=1e-5)
    base = slots_per_token < 0
    assert torch.equal(out[base], y[base])


def test_a_long_prompt_beside_decodes_is_not_padded():
    from inflight.engine.lora.slots import LoraStep

    step = LoraStep.plan([0, 1, 2], [100, 1, 1], torch.device("cpu"))
    assert step.runs == [] and [s for s, _ in step.groups] == [0, 1, 2]
    step = LoraStep.plan([0, 1, 2], [1, 1, 1], torch.device("cpu"), batch=False)
    assert step.runs == [] and len(step.groups) == 3
