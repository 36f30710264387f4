"""Service subcommands: submit, result, stream, cancel, worker, recorder, demo.

Human-readable output by default; `--json` prints one JSON object per line for scripts.
Unknown request ids print "not found" and exit 1 (never a trace).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from inflight.cli import cli_io
from inflight.schemas import SchemaError, Settings, parse_batch_line


def _params(args: Any) -> dict[str, Any]:
    p: dict[str, Any] = {}
    for name in ("max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "min_p", "min_tokens"):
        value = getattr(args, name, None)
        if value is not None:
            p[name] = value
    if args.stop:
        p["stop"] = args.stop
    if args.ignore_eos:
        p["ignore_eos"] = True
    if getattr(args, "logit_bias", None):
        p["logit_bias"] = dict(_bias(item) for item in args.logit_bias)
    if getattr(args, "bad_words", None):
        p["bad_words"] = args.bad_words
    if getattr(args, "allowed_token_ids", None):
        p["allowed_token_ids"] = args.allowed_token_ids
    so = _structured(args)
    if so is not None:
        p["structured_outputs"] = so
    return p


def _bias(item: str) -> tuple[str, float]:
    """--logit-bias TOKEN_ID=BIAS"""
    tid, sep, bias = item.partition("=")
    try:
        return str(int(tid)), float(bias)
    except ValueError:
        raise SystemExit(f"--logit-bias {item!r}: write TOKEN_ID=BIAS, e.g. 50256=-100") from None


def _structured(args: Any) -> dict[str, Any] | None:
    """--json-schema FILE / --json-object / --regex / --choice (repeatable) / --grammar FILE."""
    if getattr(args, "json_schema", None):
        try:
            with open(args.json_schema, "rb") as f:
                return {"json": orjson.loads(f.read())}
        except (OSError, orjson.JSONDecodeError) as exc:
            raise SchemaError(f"--json-schema {args.json_schema}: not a readable JSON file "
                              f"({exc})", field="json_schema") from None
    if getattr(args, "grammar", None):
        try:
            with open(args.grammar, encoding="utf-8") as f:
                return {"grammar": f.read()}
        except (OSError, UnicodeDecodeError) as exc:
            raise SchemaError(f"--grammar {args.grammar}: not a readable text file ({exc})",
                              field="grammar") from None
    if getattr(args, "json_object", False):
        return {"json_object": True}
    if getattr(args, "regex", None) is not None:
        return {"regex": args.regex}
    if getattr(args, "choice", None):
        return {"choice": list(args.choice)}
    return None


def _result_human(res: Any) -> str:
    if not res.found:
        return f"{res.request_id}: not found"
    lines = [f"{res.request_id}: {res.status}" + (f" ({res.finish_reason})" if res.finish_reason else "")]
    if res.text is not None:
        lines.append(res.text)
    if res.error:
        lines.append(f"error [{res.error_code}]: {res.error}")
    if res.usage:
        u = res.usage
        lines.append(f"usage: prompt={u.get('prompt_tokens')} completion={u.get('completion_tokens')} "
                     f"cached={u.get('cached_prompt_tokens')}")
    t = res.timings or {}
    if t.get("submitted_at") and t.get("finished_at"):
        ttft = (t["first_token_at"] - t["submitted_at"]) if t.get("first_token_at") else None
        lines.append(f"latency: {t['finished_at'] - t['submitted_at']:.3f}s"
                     + (f" ttft: {ttft:.3f}s" if ttft is not None else ""))
    return "\n".join(lines)


def cmd_submit(args: Any, settings: Settings) -> int:
    client = cli_io.client(settings)
    try:
        if args.file:
            return _submit_file(args, client)
        if not args.prompt:
            print("inflight submit: give a prompt or --file FILE.jsonl", file=sys.stderr)
            return 2
        prompt = " ".join(args.prompt)
        kw: dict[str, Any] = {"request_id": args.id, "batch_id": args.batch_id,
                              "model": args.model, "allow_unserved": args.allow_unserved,
                              "tenant": args.tenant, "timeout": args.expire_after}
        if args.priority is not None:
            kw["priority"] = args.priority
        if args.chat:
            kw["messages"] = [{"role": "user", "content": prompt}]
        rid = client.submit(None if args.chat else prompt, _params(args) or None, **kw)
        cli_io.out(args, rid, {"request_id": rid, "status": "submitted"})
        if args.stream:
            return _stream(args, client, rid)
        if args.wait:
            res = client.wait(rid, timeout=args.timeout)
            cli_io.out(args, _result_human(res), res.to_dict())
            return 0 if res.done else 1
        return 0
    finally:
        client.close()


def _submit_file(args: Any, client: Any) -> int:
    bad = 0
    reqs = []
    with open(args.file, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                reqs.append(parse_batch_line(line, batch_id=args.batch_id, line_no=n))
            except SchemaError as exc:
                bad += 1
                print(f"{args.file}: {exc.message}", file=sys.stderr)
    ids = client.submit_many(reqs, progress=None if not args.json else False, model=args.model,
                             allow_unserved=args.allow_unserved, tenant=args.tenant)
    cli_io.out(args, f"submitted {len(ids)} requests from {args.file}" + (f" ({bad} bad lines skipped)" if bad else ""),
         {"submitted": len(ids), "bad_lines": bad, "request_ids": ids})
    return 1 if bad else 0


def cmd_result(args: Any, settings: Settings) -> int:
    client = cli_io.client(settings)
    try:
        res = client.wait(args.id, timeout=args.timeout) if args.wait else client.result(args.id)
        cli_io.out(args, _result_human(res), res.to_dict())
        return 0 if res.found else 1
    finally:
        client.close()


def _stream(args: Any, client: Any, rid: str) -> int:
    from inflight.schemas import ErrorEvent, TokenEvent

    printed = False
    for event in client.stream(rid, timeout=args.timeout):
        if args.json:
            cli_io.out(args, "", event.model_dump(mode="json"))
        elif isinstance(event, TokenEvent):
            if event.index == 0 and printed:  # a new attempt (the request was redone)
                print("\n[restarted on another attempt]")
            sys.stdout.write(event.text)
            sys.stdout.flush()
            printed = True
        elif isinstance(event, ErrorEvent):
            print(f"\n[error {event.code}: {event.message}]")
            return 1
        else:
            print(f"\n[{event.finish_reason}; {event.usage.completion_tokens} tokens]")
    return 0


def cmd_stream(args: Any, settings: Settings) -> int:
    from inflight.producers.client import RequestNotFound

    client = cli_io.client(settings)
    try:
        return _stream(args, client, args.id)
    except RequestNotFound as exc:
        cli_io.out(args, str(exc), {"request_id": args.id, "status": "not_found", "message": str(exc)})
        return 1
    finally:
        client.close()


def cmd_cancel(args: Any, settings: Settings) -> int:
    client = cli_io.client(settings)
    try:
        client.cancel(args.id)
        cli_io.out(args, f"cancel sent for {args.id}", {"request_id": args.id, "status": "cancel_sent"})
        return 0
    finally:
        client.close()


def with_flags(args: Any, settings: Settings) -> Settings:
    """The settings with the command's flags over them: a flag whose `dest` is a Settings
    field sets that field (checked as INFLIGHT_* is: a bad value is a ConfigError)."""
    given = {name: value for name, value in vars(args).items()
             if name in Settings.model_fields and value is not None}
    return settings.updated(**given) if given else settings


def cmd_worker(args: Any, settings: Settings) -> int:
    from inflight.consumers.engine_bridge import build_engine
    from inflight.consumers.worker import run_worker

    if getattr(args, "worker_loras", None):
        args.worker_loras = dict(args.worker_loras)  # --lora NAME=PATH, repeated
    settings = with_flags(args, settings)
    return run_worker(settings, build_engine(settings))


def cmd_recorder(args: Any, settings: Settings) -> int:
    from inflight.consumers.recorder import Recorder

    rec = Recorder(with_flags(args, settings))
    rec.install_signal_handlers()
    rec.run()
    return 0


def _lora_module(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--lora {value!r}: give NAME=PATH (a PEFT LoRA folder)")
    return name, path


def _mib(value: str) -> int:
    return int(value) << 20


def _add_worker_flags(w: Any) -> None:
    """`inflight worker`: each flag sets the Settings field its `dest` names (the engine
    options: Settings.engine_option_names) and wins over INFLIGHT_*; docs/configuration.md
    has a row for each."""
    w.add_argument("--model", dest="model_path", default=None,
                   help="a Hugging Face folder (default: INFLIGHT_MODEL_PATH or SmolLM2-135M)")
    w.add_argument("--served-model-name", dest="served_model_name", default=None, metavar="NAME",
                   help="the model id requests name (default: the folder's name); its "
                        "request topics and group are its own unless it is "
                        "INFLIGHT_DEFAULT_MODEL")
    w.add_argument("--model-kind", dest="model_kind", default=None, choices=("auto", "generate", "embed"),
                   help="embed: serve embeddings (default auto: a sentence-transformers folder "
                        "or an encoder architecture embeds, others generate)")
    w.add_argument("--max-inflight", dest="worker_max_inflight", type=int, default=None)
    w.add_argument("--metrics-port", dest="metrics_port", type=int, default=None,
                   help="Prometheus /metrics port")
    w.add_argument("--device", dest="device", default=None, help="cpu | cuda | cuda:N | cuda:auto")
    w.add_argument("--dtype", dest="dtype", default=None, help="float32 | bfloat16 | float16")
    w.add_argument("--max-num-seqs", dest="max_num_seqs", default=None,
                   help="requests running at once (default: --max-inflight)")
    w.add_argument("--max-num-batched-tokens", dest="max_num_batched_tokens", default=None,
                   help="tokens of one forward pass (2048)")
    w.add_argument("--max-model-len", dest="max_model_len", default=None,
                   help="context cap (default: the checkpoint's)")
    w.add_argument("--kv-cache-mb", dest="kv_cache_bytes", type=_mib, default=None,
                   help="KV cache budget in MiB (INFLIGHT_KV_CACHE_BYTES in bytes)")
    w.add_argument("--kv-cache-memory-fraction", dest="kv_cache_memory_fraction", default=None,
                   help="CUDA: share of the GPU's memory the engine fills (0.9)")
    w.add_argument("--block-size", dest="block_size", default=None, help="tokens per KV block (16)")
    w.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", default=None,
                   metavar="BOOL", help="prefix sharing (true)")
    w.add_argument("--kernels", dest="kernels", default=None, help="torch | triton")
    w.add_argument("--cuda-graphs", dest="cuda_graphs", default=None, metavar="BOOL",
                   help="decode steps as CUDA graphs (default: on for CUDA + triton)")
    w.add_argument("--tensor-parallel-size", dest="tensor_parallel_size", default=None,
                   help="shard the model over N ranks (GPUs cuda:i..i+N-1)")
    w.add_argument("--kv-cache-dtype", dest="kv_cache_dtype", default=None,
                   choices=("auto", "int8", "fp8", "fp8_e4m3"),
                   help="KV cache element type: auto (the model dtype), int8 or fp8 e4m3 with "
                        "per-token scales, ~2x the tokens of bf16")
    w.add_argument("--lora", dest="worker_loras", action="append", type=_lora_module, default=None,
                   metavar="NAME=PATH", help="serve the PEFT LoRA folder PATH as model NAME on "
                   "this base model (repeatable; INFLIGHT_WORKER_LORAS as JSON)")
    w.add_argument("--max-loras", dest="max_loras", default=None,
                   help="LoRA adapters resident at once (default: as many as --lora gives)")
    w.add_argument("--max-lora-rank", dest="max_lora_rank", default=None,
                   help="the largest LoRA rank (16)")
    w.add_argument("--max-cpu-loras", dest="max_cpu_loras", default=None,
                   help="LoRA adapters kept read in host memory (default: --max-loras)")
    w.add_argument("--speculative-config", dest="speculative_config", default=None, metavar="JSON",
                   help='speculative decoding with vLLM\'s keys, e.g. \'{"method": "ngram", '
                        '"num_speculative_tokens": 4}\'')
    w.add_argument("--fair-share", dest="fair_share", default=None, metavar="BOOL",
                   help="fair share between tenants within a priority class (true)")
    w.add_argument("--tenant-weights", dest="tenant_weights", default=None, metavar="JSON",
                   help='tenant weights, e.g. \'{"team-a": 1, "team-b": 3}\' (others: 1)')


def _add_sampling(p: Any) -> None:
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--presence-penalty", type=float, default=None, help="OpenAI's, -2..2")
    p.add_argument("--frequency-penalty", type=float, default=None, help="OpenAI's, -2..2")
    p.add_argument("--repetition-penalty", type=float, default=None, help="transformers', > 0 (1 = off)")
    p.add_argument("--min-p", type=float, default=None, help="0..1")
    p.add_argument("--min-tokens", type=int, default=None)
    p.add_argument("--logit-bias", action="append", default=None, metavar="TOKEN_ID=BIAS",
                   help="add BIAS (-100..100) to a token's logit (repeatable)")
    p.add_argument("--bad-word", dest="bad_words", action="append", default=None,
                   help="a word never to emit (repeatable)")
    p.add_argument("--allowed-token-id", dest="allowed_token_ids", action="append", type=int,
                   default=None, help="sample only these token ids (repeatable)")


def register(sub: Any) -> None:
    from inflight.cli import demo

    s = sub.add_parser("submit", help="publish a prompt, or a JSONL file of requests (ours or OpenAI Batch lines)")
    s.add_argument("prompt", nargs="*", help="the prompt text")
    s.add_argument("--file", default=None, help="JSONL: one request per line, or OpenAI Batch lines")
    s.add_argument("--chat", action="store_true", help="send the prompt as one user chat message")
    s.add_argument("--id", default=None, help="request id (idempotency key); default: a new uuid")
    s.add_argument("--batch-id", default=None)
    s.add_argument("--priority", type=int, default=None, help="lower = more urgent; >= 10 goes to the batch topic")
    s.add_argument("--model", default=None, metavar="NAME",
                   help="the model to run it (`inflight models`; default: the default model); "
                        "with --file, for lines that name none")
    s.add_argument("--allow-unserved", action="store_true",
                   help="submit for a model no live worker serves yet (it waits in its topic)")
    s.add_argument("--tenant", default=None, metavar="NAME",
                   help="who the requests are for (fair share, usage; default INFLIGHT_TENANT)")
    s.add_argument("--expire-after", dest="expire_after", type=float, default=None,
                   metavar="SECONDS", help="the request's timeout: not done by then, it ends "
                                           "`expired` (docs/tenants.md)")
    _add_sampling(s)
    c = s.add_mutually_exclusive_group()  # structured outputs (docs/structured-outputs.md)
    c.add_argument("--json-schema", metavar="FILE", default=None,
                   help="the output is JSON matching the JSON Schema in FILE")
    c.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    c.add_argument("--regex", default=None, help="the output matches this regular expression")
    c.add_argument("--choice", action="append", default=None,
                   help="the output is one of these strings (repeatable)")
    c.add_argument("--grammar", metavar="FILE", default=None,
                   help="the output follows the grammar in FILE (Lark or GBNF)")
    s.add_argument("--stream", action="store_true", help="then stream its tokens")
    s.add_argument("--wait", action="store_true", help="then wait for its stored result")
    s.add_argument("--timeout", type=float, default=120.0)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_submit)

    r = sub.add_parser("result", help="a request's stored state by id")
    r.add_argument("id")
    r.add_argument("--wait", action="store_true", help="wait until it is final")
    r.add_argument("--timeout", type=float, default=None)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_result)

    st = sub.add_parser("stream", help="stream a request's tokens from the results topic")
    st.add_argument("id")
    st.add_argument("--timeout", type=float, default=120.0)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_stream)

    c = sub.add_parser("cancel", help="abort a request on whichever worker runs it")
    c.add_argument("id")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cancel)

    w = sub.add_parser("worker", help="run a GPU worker (group inflight-workers, or its "
                                      "model's own); every flag wins over its INFLIGHT_* setting")
    _add_worker_flags(w)
    w.set_defaults(func=cmd_worker, extra="worker")

    rc = sub.add_parser("recorder", help="run the recorder (results -> store)")
    rc.add_argument("--metrics-port", dest="metrics_port", type=int, default=None,
                    help="Prometheus /metrics on PORT+1 (PORT is the worker's)")
    rc.set_defaults(func=cmd_recorder, extra="worker")

    d = sub.add_parser("demo", help="the whole path on embedded defaults: broker, worker, recorder, SQLite, SmolLM2")
    d.add_argument("--model", default=None, help="a local Hugging Face folder instead of the bundled model")
    d.add_argument("--max-tokens", type=int, default=24)
    d.add_argument("--data-dir", default=None, help="keep the demo's SQLite here (default: a temp dir)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=demo.run, extra="all")


def settings_env(settings: Settings) -> dict[str, str]:
    """INFLIGHT_* environment that recreates these settings in a child process."""
    env = {}
    for name, value in settings.model_dump(mode="json").items():
        if value is None:
            continue
        env[f"INFLIGHT_{name.upper()}"] = (orjson.dumps(value).decode()
                                           if isinstance(value, (dict, list)) else str(value))
    return env


__all__ = ["register", "settings_env"]
