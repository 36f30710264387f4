"""Batch-job subcommands: `inflight batch create|status|list|cancel|results` and
`inflight jobs` (a Celery worker with the sweep; beat embedded).

`batch create` uploads the file (progress bar), creates the batch and follows the Celery
worker's validation and enqueueing from the batch row (progress bars) until every request
is published, the batch fails validation, or --no-wait.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from inflight.cli import cli_io
from inflight.schemas import Settings
from inflight.schemas.errors import SchemaError

HINT_AFTER_S = 15.0  # no validation progress by then: say that `inflight jobs` must run


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SchemaError(f"--metadata {pair!r}: write key=value")
        out[key] = value
    return out


def _human(b: Any) -> str:
    c = b.request_counts
    lines = [f"{b.id}: {b.status}  endpoint={b.endpoint}  window={b.completion_window}",
             f"  requests: total={c['total']} completed={c['completed']} failed={c['failed']}"
             f" cancelled={b.request_cancelled} expired={b.request_expired}",
             f"  progress: validated={b.lines_validated} lines, enqueued={b.lines_enqueued}"]
    if b.output_file_id or b.error_file_id:
        lines.append(f"  files: output={b.output_file_id} errors={b.error_file_id}")
    for e in (b.errors or [])[:20]:
        lines.append(f"  error: {e.get('message')}")
    if b.errors and len(b.errors) > 20:
        lines.append(f"  ... {len(b.errors) - 20} more (--json shows all)")
    return "\n".join(lines)


def _follow(client: Any, batch_id: str, line_count: int, show: bool, timeout: float) -> Any:
    """Progress bars from the batch row until validation failed or every request is out."""
    from tqdm import tqdm

    deadline = time.monotonic() + timeout
    started = time.monotonic()
    hinted = False
    bars: dict[str, Any] = {}
    try:
        while True:
            b = client.get_batch(batch_id)
            if b.lines_validated or b.status != "validating":
                bar = bars.setdefault("validate", tqdm(total=line_count, unit="line",
                                                       desc="validate", disable=not show))
                bar.update(b.lines_validated - bar.n)
            if b.status != "validating" and b.request_total:
                bar = bars.setdefault("enqueue", tqdm(total=b.request_total, unit="req",
                                                      desc="enqueue", disable=not show))
                bar.update(b.lines_enqueued - bar.n)
            if b.is_final or b.status == "cancelling" or (
                    b.status == "in_progress" and b.lines_enqueued >= b.request_total):
                return b
            if not hinted and b.status == "validating" and not b.lines_validated and \
                    time.monotonic() - started > HINT_AFTER_S:
                print(f"(batch {batch_id} is waiting for a Celery worker: is `inflight jobs` "
                      "running with the same INFLIGHT_CELERY_BROKER?)", file=sys.stderr)
                hinted = True
            if time.monotonic() > deadline:
                return b
            time.sleep(0.3)
    finally:
        for bar in bars.values():
            bar.close()


def cmd_create(args: Any, settings: Settings) -> int:
    from inflight.producers.batch_jobs import batch_object

    client = cli_io.client(settings)
    try:
        show = not args.json and sys.stderr.isatty() or args.progress
        b = client.create_batch(Path(args.file), endpoint=args.endpoint,
                                completion_window=args.window,
                                metadata=_metadata(args.metadata), progress=show,
                                prompt_column=args.prompt_column, id_column=args.id_column,
                                system=args.system, template=args.template,
                                max_tokens=args.max_tokens, model=args.model)
        if not args.json:
            print(b.id, flush=True)
        if not args.no_wait:
            f = client.store.require_file(b.input_file_id)
            b = _follow(client, b.id, f.line_count, show, args.timeout)
        if args.json:
            cli_io.out(args, "", batch_object(b))
        else:
            print(_human(b))
        return 1 if b.status == "failed" else 0
    finally:
        client.close()


def cmd_status(args: Any, settings: Settings) -> int:
    from inflight.producers.batch_jobs import batch_object

    client = cli_io.client(settings)
    try:
        b = client.wait_batch(args.id, timeout=args.timeout) if args.wait else client.get_batch(args.id)
        cli_io.out(args, _human(b), batch_object(b))
        return 0
    finally:
        client.close()


def cmd_list(args: Any, settings: Settings) -> int:
    from inflight.producers.batch_jobs import batch_object

    client = cli_io.client(settings)
    try:
        rows = client.list_batches(limit=args.limit, after=args.after)
        if args.json:
            for b in rows:
                cli_io.out(args, "", batch_object(b))
        else:
            for b in rows:
                c = b.request_counts
                print(f"{b.id}  {b.status:<11} {c['completed']}/{c['total']} done, "
                      f"{c['failed']} failed  created {b.created_at:%Y-%m-%d %H:%M:%S}")
            if not rows:
                print("no batches")
        return 0
    finally:
        client.close()


def cmd_cancel(args: Any, settings: Settings) -> int:
    from inflight.producers.batch_jobs import batch_object

    client = cli_io.client(settings)
    try:
        b = client.cancel_batch(args.id)
        cli_io.out(args, f"{b.id}: {b.status} (the sweep ends it `cancelled` once its running "
                   "requests have stopped)", batch_object(b))
        return 0
    finally:
        client.close()


def cmd_partial(args: Any, settings: Settings) -> int:
    """--partial: the lines of the requests finished so far (producers.batch_partial)."""
    from inflight.producers.batch_partial import read_page

    client = cli_io.client(settings)
    fh = open(args.output, "wb") if args.output not in (None, "-") else sys.stdout.buffer
    n, after = 0, args.after
    try:
        b = client.get_batch(args.id)
        while True:
            page = read_page(client.store, b, after=after,
                             default_model=settings.served_model_id())
            for line in page.lines:
                fh.write(line + b"\n")
            n += len(page.lines)
            after = page.next_after
            if not page.has_more:
                break
        fh.flush()
        print(f"{b.id}: {b.status}, {n} finished lines written"
              + (f"; resume with --partial --after {after}" if after else ""), file=sys.stderr)
        return 0
    finally:
        if fh is not sys.stdout.buffer:
            fh.close()
        client.close()


def cmd_results_parquet(args: Any, settings: Settings) -> int:
    """-o out.parquet: the input table's columns (a Parquet batch) plus the response
    columns, a row group at a time (producers.batch_parquet)."""
    from inflight.producers.batch_parquet import write_results

    client = cli_io.client(settings)
    try:
        b = client.get_batch(args.id)
        n = write_results(client.store, b, args.output)
        print(f"{b.id}: {b.status}, wrote {n} rows to {args.output}", file=sys.stderr)
        return 0
    finally:
        client.close()


def cmd_results(args: Any, settings: Settings) -> int:
    if args.partial:
        return cmd_partial(args, settings)
    if args.output and args.output.lower().endswith(".parquet"):
        return cmd_results_parquet(args, settings)
    client = cli_io.client(settings)
    try:
        b = client.get_batch(args.id)
        counts = {}
        for kind, dest in (("output", args.output), ("errors", args.errors)):
            if kind == "errors" and dest is None:
                continue
            lines = client.batch_file_lines(b.id, errors=kind == "errors")
            fh = open(dest, "wb") if dest not in (None, "-") else sys.stdout.buffer
            n = 0
            try:
                for line in lines:
                    fh.write(line + b"\n")
                    n += 1
            finally:
                if fh is not sys.stdout.buffer:
                    fh.close()
                else:
                    fh.flush()
            counts[kind] = n
        if args.output not in (None, "-") or args.errors:
            msg = ", ".join(f"{n} {k} lines" for k, n in counts.items())
            print(f"{b.id}: wrote {msg}", file=sys.stderr)
        return 0
    finally:
        client.close()


def cmd_jobs(args: Any, settings: Settings) -> int:
    from inflight.cli.model import DEFAULT_MODEL_NAME, default_model_dir
    from inflight.producers.batch_tasks import run_worker, worker_app

    if args.model:
        settings = settings.model_copy(update={"model_path": args.model})
    model_dir = None if settings.model_path else default_model_dir(settings)
    name = Path(settings.model_path).name if settings.model_path else DEFAULT_MODEL_NAME
    app = worker_app(settings, model_dir=model_dir, model_name=name)
    run_worker(app, concurrency=args.concurrency, pool=args.pool, beat=not args.no_beat,
               loglevel="DEBUG" if args.verbose else "INFO")
    return 0


def register(sub: Any) -> None:
    b = sub.add_parser("batch", help="overnight batch jobs (OpenAI / Anthropic batch files)")
    bsub = b.add_subparsers(dest="batch_cmd", required=True)

    c = bsub.add_parser("create", help="upload a JSONL file and start a batch; prints its id")
    c.add_argument("file")
    c.add_argument("--endpoint", default="/v1/chat/completions",
                   help="/v1/chat/completions | /v1/completions | /v1/embeddings | /v1/messages (Anthropic)")
    c.add_argument("--window", default="24h", help="completion window, e.g. 24h, 90m")
    c.add_argument("--metadata", action="append", default=None, metavar="K=V")
    c.add_argument("--no-wait", action="store_true", help="return once the batch exists")
    c.add_argument("--progress", action="store_true", help="progress bars even without a terminal")
    c.add_argument("--timeout", type=float, default=3600.0)
    c.add_argument("--json", action="store_true")
    c.add_argument("--prompt-column", default=None, help="a Parquet table (file.parquet): the "
                   "column whose text is each row's prompt (one request per row)")
    c.add_argument("--id-column", default=None, help="Parquet: the column carried through as "
                   "custom_id (default: a column named custom_id or id, else row-<n>)")
    c.add_argument("--system", default=None, help="Parquet, chat: a system message for every row")
    c.add_argument("--template", default=None, help="Parquet: the prompt, with {text} where "
                   "the prompt column's text goes")
    c.add_argument("--max-tokens", type=int, default=None,
                   help="Parquet: max_tokens of every row (default 256)")
    c.add_argument("--model", default=None, help="Parquet: the model of every row")
    c.set_defaults(func=cmd_create, extra="jobs")

    s = bsub.add_parser("status", help="a batch's status, counts and files")
    s.add_argument("id")
    s.add_argument("--wait", action="store_true", help="wait until it has ended")
    s.add_argument("--timeout", type=float, default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    ls = bsub.add_parser("list", help="batches, newest first")
    ls.add_argument("--limit", type=int, default=20)
    ls.add_argument("--after", default=None, help="a batch id: list older ones")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    k = bsub.add_parser("cancel", help="cancel a batch (it keeps its finished results)")
    k.add_argument("id")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_cancel)

    r = bsub.add_parser("results", help="write an ended batch's output (and error) lines")
    r.add_argument("id")
    r.add_argument("-o", "--output", default=None, help="output file (default: stdout); "
                   "*.parquet: the input table's columns plus the response columns")
    r.add_argument("--errors", default=None, help="also write the error file here")
    r.add_argument("--partial", action="store_true", help="while it runs: the lines of the "
                   "requests finished so far (output and error lines, in the order recorded)")
    r.add_argument("--after", default=None, help="with --partial: resume after this cursor")
    r.set_defaults(func=cmd_results)

    j = sub.add_parser("jobs", help="run a Celery worker for batch jobs (with the periodic sweep)")
    j.add_argument("--concurrency", type=int, default=2)
    j.add_argument("--pool", default="threads", help="threads | prefork | solo")
    j.add_argument("--no-beat", action="store_true", help="no sweep schedule in this worker")
    j.add_argument("--model", default=None, help="model folder (its config.json gives the context length)")
    j.set_defaults(func=cmd_jobs, extra="jobs")


__all__ = ["register"]
