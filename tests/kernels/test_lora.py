"""Triton LoRA shrink/expand against the torch references (interpreter on CPU), and the
engine's CPU path (slot groups) against the per-token definition."""

import pytest
import torch

from inflight.kernels.lora import lora_add_blocks, lora_add_groups, lora_add_ref
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


def _blocks_of(b: torch.Tensor, blocks: list[tuple[int, int]], R: int) -> list:
    """The packed [S, C, N] B of a block-diagonal adapter, split as the CPU layout stores it."""
    return [(start, stop, b[:, j * R:(j + 1) * R, start:stop].contiguous()) for j, (start, stop) in enumerate(blocks)]


def test_blocks_match_reference():
    """The CPU layout's batched runs and slot groups (engine/lora/slots.py plans them) against
    the per-token definition: interleaved slots, uneven counts (padded rows), base tokens
    between, a block one slot leaves alone and lower ranks, and a run beside a lone slot."""
    from inflight.engine.lora.slots import LoraStep

    g = torch.Generator().manual_seed(3)
    S, R, K = 5, 4, 24
    blocks = [(0, 16), (16, 24), (24, 32)]   # q | k | v rows of a fused qkv
    N = 32
    a = torch.randn(S, 3 * R, K, generator=g) / K ** 0.5
    b = torch.zeros(S, 3 * R, N)
    for j, (start, stop) in enumerate(blocks):
        b[:, j * R:(j + 1) * R, start:stop] = torch.randn(S, R, stop - start, generator=g) / R ** 0.5
    # slot 2: rank 3 on q, nothing on k; slot 3: nothing at all
    a[2, 3:R] = 0
    a[2, R:2 * R] = 0
    b[2, :, 16:24] = 0
    b[2, 3:R] = 0
    a[3] = 0
    b[3] = 0
    ranks = [[R, R, 3, 0, R], [R, R, 0, 0, R], [R, R, R, 0, R]]
    used = [3 * R, 3 * R, 3 * R, 0, 3 * R]
    parts = _blocks_of(b, blocks, R)
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
        lora_add_blocks(out, x, a, parts, R, run.lo, run.hi, run.idx, run.mask, max(used[run.lo:run.hi]),
                        [max(r[run.lo:run.hi]) for r in ranks])
    for slot, rows in step.groups:
        lora_add_blocks(out, x, a, parts, R, slot, slot + 1, rows, None, used[slot], [r[slot] for r in ranks])
    torch.testing.assert_close(out, lora_add_ref(y.clone(), x, a, b, slots_per_token), atol=1e-5, rtol=1e-5)
    base = slots_per_token < 0
    assert torch.equal(out[base], y[base])
    # one slot by an index of rows (two runs of a request's tokens)
    out = y.clone()
    rows = torch.tensor([0, 4])
    lora_add_blocks(out, x, a, parts, R, 0, 1, rows, None, used[0], [r[0] for r in ranks])
    only0 = torch.where(slots_per_token == 0, 0, -1).to(torch.int32)
    torch.testing.assert_close(out, lora_add_ref(y.clone(), x, a, b, only0), atol=1e-5, rtol=1e-5)


def test_a_long_prompt_beside_decodes_is_not_padded():
    from inflight.engine.lora.slots import LoraStep

    step = LoraStep.plan([0, 1, 2], [100, 1, 1], torch.device("cpu"))
    assert step.runs == [] and [s for s, _ in step.groups] == [0, 1, 2]
    step = LoraStep.plan([0, 1, 2], [1, 1, 1], torch.device("cpu"), batch=False)
    assert step.runs == [] and len(step.groups) == 3


def test_native_lora_add_matches_reference():
    """kernels/csrc/cpu_lora.cpp (the engine's CPU path where it builds) against the per-token
    definition: slots in any order, several tokens of a slot (a tile of 4 and a tail), a
    block one slot leaves alone, a rank below max_lora_rank, base tokens untouched."""
    from inflight.engine.lora.slots import LoraStep
    from inflight.kernels.lora import native_lora

    mod = native_lora()
    if mod is None:
        pytest.skip("the C++ kernels do not build or run here (AVX-512)")
    g = torch.Generator().manual_seed(5)
    S, R, K = 4, 8, 64
    blocks = [(0, 32), (32, 48), (48, 64)]
    N = 64
    a = torch.zeros(S, 3 * R, K)
    b = torch.zeros(S, 3 * R, N)
    ranks = torch.zeros(3, S, dtype=torch.int32)
    for s, rk in enumerate([(8, 8, 8), (5, 0, 8), (0, 0, 0), (8, 3, 1)]):
        for j, r in enumerate(rk):
            start, stop = blocks[j]
            a[s, j * R:j * R + r] = torch.randn(r, K, generator=g) / K ** 0.5
            b[s, j * R:j * R + r, start:stop] = torch.randn(r, stop - start, generator=g) / r ** 0.5
            ranks[j, s] = r
    parts = [b[:, j * R:(j + 1) * R, start:stop].contiguous() for j, (start, stop) in enumerate(blocks)]
    reqs = [(3, 1), (-1, 2), (0, 6), (1, 1), (3, 2), (2, 1), (0, 1), (-1, 1)]
    per_token = torch.tensor([s for s, k in reqs for _ in range(k)], dtype=torch.int32)
    T = per_token.numel()
    x = torch.randn(T, K, generator=g)
    y = torch.randn(T, N, generator=g)
    step = LoraStep.plan([s for s, _ in reqs], [k for _, k in reqs], torch.device("cpu"), native=True)
    assert step.segs[:, 0].tolist() == [0, 1, 2, 3]
    out = y.clone()
    starts = torch.tensor([0, 32, 48, 64], dtype=torch.int64)
    mod.lora_add(out, x, a, parts, starts, ranks, R, step.order, step.segs)
    torch.testing.assert_close(out, lora_add_ref(y.clone(), x, a, b, per_token), atol=1e-5, rtol=1e-5)
    assert torch.equal(out[per_token < 0], y[per_token < 0])
    with pytest.raises(RuntimeError, match="segment out of range"):
        mod.lora_add(out, x, a, parts, starts, ranks, R, step.order, torch.tensor([[9, 0, 1]]))
    with pytest.raises(RuntimeError, match="rank outside"):
        mod.lora_add(out, x, a, parts, starts, ranks + R, R, step.order, step.segs)
