"""`inflight` command line: one entry point, a subcommand per job.

Each subcommand lives in the module that owns the work; this file only parses arguments
and dispatches. Output is for people by default and JSON with --json.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import time

from inflight.cli import cli_io
from inflight.engine.bundled_models import BUNDLED
from inflight.schemas.errors import ConfigError, InflightError, needs_extra
from inflight.schemas.settings import Settings


def cmd_broker(args, settings: Settings) -> int:
    from inflight.cli.broker import EmbeddedBroker
    from inflight.cli.topics import create_topics

    storage = None
    if args.s3_bucket:
        import os

        from inflight.cli.broker_storage import S3Storage

        storage = S3Storage(args.s3_bucket, endpoint=args.s3_endpoint,
                            key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
                            secret=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
                            region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    broker = EmbeddedBroker(port=args.port, log_path=args.log, storage=storage)
    broker.start()
    stop = {"now": False}

    def _stop(*_):
        stop["now"] = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    topics = {}
    if args.create_topics:
        topics = create_topics(settings.model_copy(update={"kafka_bootstrap": broker.bootstrap}),
                               partitions=args.partitions)
    cli_io.out(args, f"broker ready bootstrap={broker.bootstrap} pid={broker.proc.pid} "
                 f"({'s3://' + args.s3_bucket if args.s3_bucket else 'memory'} storage; Ctrl-C stops it)\nexport INFLIGHT_KAFKA_BOOTSTRAP={broker.bootstrap}",
           {"bootstrap": broker.bootstrap, "pid": broker.proc.pid, "topics": topics})
    try:
        while not stop["now"] and broker.alive():
            time.sleep(0.2)
    finally:
        broker.stop()
    return 0


def cmd_topics(args, settings: Settings) -> int:
    from inflight.cli.topics import create_topics
    from inflight.transport.model_topics import ModelTopics

    models = [ModelTopics.of(settings, name) for name in args.model or ()]
    status = create_topics(settings, partitions=args.partitions, models=models)
    cli_io.out(args, "\n".join(f"{t}: {s}" for t, s in status.items()), status)
    return 0


def cmd_db(args, settings: Settings) -> int:
    from inflight.store.migrate import upgrade

    url = args.url or settings.database_url
    upgrade(url)
    from inflight.store.urls import redact

    cli_io.out(args, f"database at {redact(url)} is at the latest schema",
           {"database_url": redact(url), "status": "upgraded"})
    return 0


def cmd_model(args, settings: Settings) -> int:
    from inflight.cli.model import resolve_model

    from inflight.cli.model import ensure_bundled_model

    t0 = time.monotonic()
    if args.name and args.model:
        raise ConfigError("give --model PATH or --name NAME, not both")
    path = ensure_bundled_model(args.name, settings) if args.name else resolve_model(args.model, settings)
    cli_io.out(args, str(path), {"model_path": str(path), "seconds": round(time.monotonic() - t0, 2)})
    return 0


def cmd_quantize(args, settings: Settings) -> int:
    from inflight.engine.quant.config import QuantConfig
    from inflight.engine.quant.quantize import quantize_model
    from inflight.cli.model import resolve_model

    t0 = time.monotonic()
    quant = QuantConfig(args.scheme, args.group_size, args.method)
    src = resolve_model(args.model, settings)
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else \
        (lambda line: print(line, flush=True))
    sizes = {k: v for k, v in (("num_samples", args.samples), ("seq_len", args.seq_len)) if v is not None}
    out = quantize_model(src, args.output, quant, calib=args.calib, progress=say, **sizes)
    cli_io.out(args, str(out), {"model_path": str(out), "source": str(src), "scheme": quant.scheme,
                            "group_size": quant.group_size, "method": quant.method,
                            "seconds": round(time.monotonic() - t0, 2)})
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inflight", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (Tansu) in the foreground")
    b.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    b.add_argument("--partitions", type=int, default=4)
    b.add_argument("--no-topics", dest="create_topics", action="store_false", help="don't create topics")
    b.add_argument("--log", default=None, help="file for the broker's own output")
    b.add_argument("--s3-bucket", default=None,
                   help="keep the log in this S3 bucket across restarts (Tansu's s3:// storage; "
                   "credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); default: memory")
    b.add_argument("--s3-endpoint", default=None,
                   help="an S3-compatible server, e.g. http://127.0.0.1:9000 (MinIO, moto_server)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_broker, extra="worker")

    t = sub.add_parser("topics", help="manage topics")
    tsub = t.add_subparsers(dest="topics_cmd", required=True)
    tc = tsub.add_parser("create", help="create the project's topics (existing ones are kept)")
    tc.add_argument("--partitions", type=int, default=4)
    tc.add_argument("--model", action="append", default=None, metavar="NAME",
                    help="also the request topics of this model (repeatable; the default "
                         "model's are today's names, INFLIGHT_DEFAULT_MODEL)")
    tc.add_argument("--json", action="store_true")
    tc.set_defaults(func=cmd_topics)

    d = sub.add_parser("db", help="manage the store's schema")
    dsub = d.add_subparsers(dest="db_cmd", required=True)
    du = dsub.add_parser("upgrade", help="apply Alembic migrations up to the latest")
    du.add_argument("--url", default=None, help="database URL (default: INFLIGHT_DATABASE_URL)")
    du.add_argument("--json", action="store_true")
    du.set_defaults(func=cmd_db)

    m = sub.add_parser("model", help="manage the model")
    msub = m.add_subparsers(dest="model_cmd", required=True)
    mf = msub.add_parser("fetch", help="convert a bundled model once (SmolLM2-135M, or --name) "
                                       "or check --model, and print its path")
    mf.add_argument("--model", default=None, help="a local Hugging Face folder of a supported family instead")
    mf.add_argument("--name", default=None, choices=sorted(BUNDLED),
                    help="a bundled model other than the default smollm2-135m (gemma3-270m)")
    mf.add_argument("--json", action="store_true")
    mf.set_defaults(func=cmd_model, extra="worker")

    qz = sub.add_parser("quantize", help="write a weight-only quantized copy of a model folder (w8 / w4)")
    qz.add_argument("model", nargs="?", default=None,
                    help="a Hugging Face Llama-family folder (default: the bundled model)")
    qz.add_argument("-o", "--output", required=True, help="the new folder to write")
    qz.add_argument("--scheme", choices=("w8", "w4"), required=True,
                    help="w8: int8 per output channel; w4: int4 per group of --group-size")
    qz.add_argument("--group-size", type=int, default=None, help="w4 only: 128 (default), 64 or 32")
    qz.add_argument("--method", choices=("rtn", "gptq"), default="rtn",
                    help="rtn: round to nearest; gptq: error-compensating, calibrated on text")
    qz.add_argument("--calib", default=None,
                    help="gptq: a UTF-8 text file to calibrate on (default: the model's own answers to varied chat prompts, plus Python stdlib docstrings)")
    qz.add_argument("--samples", type=int, default=None, help="gptq: calibration windows (256)")
    qz.add_argument("--seq-len", type=int, default=None, help="gptq: tokens per calibration window (128)")
    qz.add_argument("--json", action="store_true")
    qz.set_defaults(func=cmd_quantize, extra="worker")

    from inflight.cli import commands  # service subcommands: submit, result, stream, worker, recorder, demo

    commands.register(sub)
    from inflight.cli import batch_commands  # batch create|status|list|cancel|results, jobs

    batch_commands.register(sub)
    from inflight.cli import api_commands  # api, keys

    api_commands.register(sub)
    from inflight.cli import models_commands  # models (the registry)

    models_commands.register(sub)
    models_commands.register_lora(sub)  # lora load|unload|list
    from inflight.cli import embed_commands  # embed FILE

    embed_commands.register(sub)
    from inflight.cli import webhook_commands  # webhooks add|list|rm|attempts

    webhook_commands.register(sub)
    return p


def _command(args: argparse.Namespace) -> str:
    """`inflight batch create`, `inflight worker`, ...: the command as typed."""
    sub = getattr(args, f"{args.cmd}_cmd", None)
    return " ".join(["inflight", args.cmd] + ([sub] if sub else []))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    # a command that needs an extra (set_defaults(extra=...)) and misses a module of it says
    # which extra to install (MissingExtraError, exit 2); the base install runs the rest
    extra = getattr(args, "extra", None)
    try:
        with needs_extra(extra, _command(args)) if extra else contextlib.nullcontext():
            return args.func(args, Settings()) or 0
    except InflightError as exc:
        print(f"inflight: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
