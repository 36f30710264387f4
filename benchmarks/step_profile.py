"""Decode-step profile: where the time of one engine step goes, per batch size.

    python benchmarks/step_profile.py [--model DIR] [--batch-sizes 1,32,256]
                                      [--cuda-graphs on|off|both] [--device cpu|cuda]

N requests (random prompts of --prompt-len tokens, greedy, ignore_eos) are prefilled,
then --steps decode steps are measured, every request decoding in every step.

On CUDA: wall ms per decode step, GPU kernel ms per step (profiler kernel rows only: a CPU
op's row repeats its kernels' time), GPU busy %, output tok/s; CUDA graphs on and off side
by side (--cuda-graphs both).

On CPU the device is the CPU, so the figure is the host work: engine step time minus the
device step (the model forward and the sampling kernels, timed around the runner's
`device_step`), per sequence per step, in wall µs and in this thread's CPU µs (steadier on
a loaded machine). The forward alone (without sampling) is shown too. `--stub-forward`
replaces the model's forward with a stub that returns one-hot logits spelling ordinary
text (the engine, detokenizer and sampler still do all their work): the forward's own
allocations then cannot trigger Python's garbage collector inside the host part, which
makes the host figure steady (with the real forward, single-sequence figures swing by
hundreds of µs with the collector).
"""

from __future__ import annotations

import random
import time

from common import base_parser, machine_note, model_path, print_table, setup_torch, write_json


def build_engine(path, args, batch: int, graphs: bool | None, max_tokens: int):
    from inflight.engine import Engine, EngineConfig

    kw = dict(model=path, dtype=args.dtype, device=args.device, max_num_seqs=batch,
              max_num_batched_tokens=max(args.max_num_batched_tokens, batch),
              enable_prefix_caching=False, seed=args.seed)
    if args.kv_cache_mib:
        kw["kv_cache_bytes"] = args.kv_cache_mib << 20
    elif not args.device.startswith("cuda"):
        # room for every request to the end (no preemption in the measured steps)
        kw["num_kv_blocks"] = batch * (-(-(args.prompt_len + max_tokens) // 16) + 1)
    if graphs is not None and "cuda_graphs" in EngineConfig.__dataclass_fields__:
        kw["cuda_graphs"] = graphs
    return Engine(EngineConfig(**kw))


def fill(eng, batch: int, prompt_len: int, max_tokens: int, vocab: int, seed: int,
         logprobs_every: int = 0) -> None:
    """Admit `batch` requests and step until every one of them is decoding; every
    `logprobs_every`-th asks for its tokens' logprobs (top 1)."""
    from inflight.engine import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    with_lp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=1)
    for i in range(batch):
        p = with_lp if logprobs_every and i % logprobs_every == 0 else params
        eng.add_request(str(i), prompt_token_ids=[rng.randrange(100, vocab) for _ in range(prompt_len)],
                        params=p)
    while any(r.num_output_tokens == 0 for r in eng.requests.values()) or eng.scheduler.waiting:
        eng.step()


class DeviceTimer:
    """Times the runner's device work (forward + sampling) and the forward alone, by
    wrapping them on this engine instance only."""

    def __init__(self, eng):
        self.wall = self.cpu = self.fwd_wall = self.fwd_cpu = 0.0
        runner = eng.runner
        device_step = runner.device_step
        forward = runner.model.forward

        def timed_device_step(*a, **kw):
            w, c = time.perf_counter(), time.thread_time()
            try:
                return device_step(*a, **kw)
            finally:
                self.wall += time.perf_counter() - w
                self.cpu += time.thread_time() - c

        def timed_forward(*a, **kw):
            w, c = time.perf_counter(), time.thread_time()
            try:
                return forward(*a, **kw)
            finally:
                self.fwd_wall += time.perf_counter() - w
                self.fwd_cpu += time.thread_time() - c

        runner.device_step = timed_device_step
        runner.model.forward = timed_forward

    def reset(self) -> None:
        self.wall = self.cpu = self.fwd_wall = self.fwd_cpu = 0.0


STUB_TEXT = ("The engine keeps one row per running request and sends a step's inputs to the "
             "device in one copy; the scheduler mixes decodes and prefill chunks under a token "
             "budget, and finished requests free their blocks at once. ")


def stub_forward(eng) -> None:
    """Replace the model forward with one-hot logits that spell STUB_TEXT, each sequence
    from its own offset: ordinary text, so detokenization does its usual work."""
    import torch

    vocab = eng.model.config.vocab_size
    text = torch.tensor(eng.tokenizer.encode(STUB_TEXT * 4, add_special_tokens=False))

    def forward(input_ids, positions, meta, kv_caches, logits_indices):
        rows = logits_indices.shape[0]
        logits = torch.zeros(rows, vocab)
        at = (positions[logits_indices].long() + input_ids[logits_indices].long()) % len(text)
        logits[torch.arange(rows), text[at]] = 1.0
        return logits

    eng.model.forward = forward


def profile_cpu(eng, batch: int, steps: int) -> dict:
    timer = DeviceTimer(eng)
    for _ in range(2):
        eng.step()
    timer.reset()
    per_step = []  # host wall of each step: its median shrugs off other jobs' preemptions
    w, c = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        s, d = time.perf_counter(), timer.wall
        eng.step()
        per_step.append((time.perf_counter() - s) - (timer.wall - d))
    wall, cpu = time.perf_counter() - w, time.thread_time() - c
    per = 1e6 / (steps * batch)
    per_step.sort()
    return dict(batch=batch, step_ms=wall / steps * 1e3, forward_ms=timer.fwd_wall / steps * 1e3,
                device_ms=timer.wall / steps * 1e3,
                host_us_seq=(wall - timer.wall) * per, host_cpu_us_seq=(cpu - timer.cpu) * per,
                host_median_us_seq=per_step[len(per_step) // 2] * 1e6 / batch,
                host_incl_sampling_us_seq=(wall - timer.fwd_wall) * per,
                tok_s=batch * steps / wall)


def profile_cuda(eng, batch: int, steps: int) -> dict:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        eng.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t) / steps * 1e3
    prof_steps = min(steps, 10)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(prof_steps):
            eng.step()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    gpu_ms = sum(e.self_device_time_total for e in ka if e.device_type == DeviceType.CUDA) / prof_steps / 1e3
    return dict(batch=batch, step_ms=step_ms, gpu_ms=gpu_ms, busy=gpu_ms / step_ms,
                tok_s=batch / step_ms * 1e3)


def free_device_memory(cuda: bool) -> None:
    """An engine's runner and graphs reference each other: collect them, then hand the
    memory back, so the next engine sizes its KV cache from a clean GPU."""
    import gc

    gc.collect()
    if cuda:
        import torch

        torch.cuda.empty_cache()


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", default="1,32,256")
    p.add_argument("--cuda-graphs", choices=["on", "off", "both"], default="both")
    p.add_argument("--prompt-len", type=int, default=None, help="default 128 on CUDA, 32 on CPU")
    p.add_argument("--steps", type=int, default=None, help="measured decode steps (default 50 CUDA, 10 CPU)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--stub-forward", action="store_true",
                   help="CPU: a stub instead of the model forward (steady host figures)")
    p.add_argument("--logprobs-every", type=int, default=0,
                   help="every Nth request asks for logprobs (0: none): what a feature that is "
                        "on costs the host, against the requests that use it")
    p.add_argument("--kv-cache-mib", type=int, default=None,
                   help="KV budget (default: CUDA: the engine's own sizing; CPU: enough for every request)")
    args = p.parse_args()
    setup_torch(args.threads, args.seed)
    import json

    cuda = args.device.startswith("cuda")
    args.prompt_len = prompt_len = args.prompt_len or (128 if cuda else 32)
    steps = args.steps or (50 if cuda else 10)
    path = model_path(args.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.cuda_graphs] if cuda else [None]
    print(f"model {path.name}, {args.dtype} on {args.device}, {args.threads} threads; prompts of "
          f"{prompt_len} tokens, {steps} measured decode steps", flush=True)
    results = []
    for graphs in modes:
        for batch in batches:
            eng = build_engine(path, args, batch, graphs, max_tokens=steps + 64)
            if args.stub_forward:
                stub_forward(eng)
            fill(eng, batch, args.prompt_len, max_tokens=steps + 64, vocab=vocab, seed=args.seed,
                 logprobs_every=args.logprobs_every)
            r = profile_cuda(eng, batch, steps) if cuda else profile_cpu(eng, batch, steps)
            r["cuda_graphs"] = graphs
            results.append(r)
            print(f"  batch {batch}: {r['step_ms']:.2f} ms/step", flush=True)
            del eng
            free_device_memory(cuda)
    if cuda:
        rows = [("on" if r["cuda_graphs"] else "off", r["batch"], r["step_ms"], r["gpu_ms"],
                 f"{r['busy']:.0%}", r["tok_s"]) for r in results]
        print_table("Decode step on CUDA", rows, ("CUDA graphs", "sequences", "wall ms/step",
                                                  "GPU kernel ms/step", "GPU busy", "tok/s"))
    else:
        rows = [(r["batch"], r["step_ms"], r["forward_ms"], r["device_ms"], r["host_us_seq"],
                 r["host_median_us_seq"], r["host_cpu_us_seq"], r["host_incl_sampling_us_seq"],
                 r["tok_s"]) for r in results]
        print_table("Decode step on CPU: host work per sequence (device step = forward + sampling)",
                    rows, ("sequences", "step ms", "forward ms", "device step ms",
                           "host us/seq/step", "median step", "host CPU us/seq/step",
                           "host+sampling us/seq/step", "tok/s"))
    print(machine_note())
    write_json(args.json, {"args": vars(args), "results": results, "machine": machine_note()})


if __name__ == "__main__":
    main()
