"""A large Parquet table through the batch jobs' side of the path, on Postgres (or SQLite):
peak resident memory of each phase against reading the table whole (the baseline, measured
in the same run).

    python benchmarks/parquet_batch.py [--rows 100000] [--database-url URL] [--json out.json]

Phases, in one process (the jobs worker's work; the GPU workers are replaced by writing each
request's final row, as the recorder would): the table becomes batch lines and is stored
(Client._upload_table), every line is validated and "published" (validate_and_enqueue with a
publisher that only counts), half the requests finish and the partial results are read
(producers.batch_partial), the rest finish, and the results are written as Parquet a row
group at a time (producers.batch_parquet.write_results) and checked: every input row once.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Peak:
    """The highest RSS sampled (every 5 ms) while the block runs, above its start."""

    def __enter__(self) -> "Peak":
        gc.collect()
        self.start = self.peak = rss_mb()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        self.t0 = time.perf_counter()
        return self

    def _run(self) -> None:
        while not self.stop.wait(0.005):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.stop.set()
        self.t.join()
        self.peak = max(self.peak, rss_mb())


class CountingPublisher:
    def __init__(self):
        self.n = 0

    def publish_encoded(self, items, *, topic):
        k = sum(1 for _ in items)
        self.n += k
        return k

    def cancel_batch_requests(self, batch_id):
        pass


def main() -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from inflight.producers import batch_jobs as jobs
    from inflight.producers.batch_lines import request_id_for
    from inflight.producers.batch_parquet import write_results
    from inflight.producers.batch_partial import read_page
    from inflight.producers.batches_client import BatchesClient
    from inflight.schemas import Settings
    from inflight.store import Store

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--database-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="parquet-batch-"))
    src = work / "table.parquet"
    n = args.rows
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    pq.write_table(pa.table({
        "doc_id": pa.array(range(10_000_000, 10_000_000 + n), pa.int64()),
        "text": [" ".join(words[(i + k) % 10] for k in range(12)) + f" #{i}" for i in range(n)],
        "lang": ["en"] * n, "score": pa.array([i / n for i in range(n)], pa.float64())}),
        src, row_group_size=10_000)
    store = Store(args.database_url, create=True)
    settings = Settings(database_url=store.url)
    results: dict[str, dict] = {}

    with Peak() as m:
        whole = pq.read_table(src).to_pylist()
    results["baseline: read the table whole (to_pylist)"] = m.__dict__
    del whole

    bc = BatchesClient(settings, lambda: store, CountingPublisher())
    with Peak() as m:
        source = bc._upload_table(src, endpoint="/v1/chat/completions", owner=None,
                                  prompt_column="text", id_column="doc_id", system="Be brief.",
                                  template="Summarize: {text}", max_tokens=16, model=None)
        b = jobs.create_batch(store, input_file_id=source.pop("input_file_id"),
                              endpoint="/v1/chat/completions")
        store.set_batch_fields(b.id, parquet_source=source)
    results["table -> batch lines, stored"] = m.__dict__
    pub = CountingPublisher()
    ctx = jobs.JobContext(store=store, publisher=pub, settings=settings, context_length=512,
                          model_name="tiny")
    with Peak() as m:
        assert jobs.validate_and_enqueue(ctx, b.id) == "enqueued", store.require_batch(b.id).errors
    results["validate + enqueue"] = m.__dict__
    assert pub.n == n

    def finish(lo: int, hi: int) -> None:
        for start in range(lo, hi, 2000):
            store.upsert_requests([{
                "id": request_id_for(b.id, str(10_000_000 + i)), "batch_id": b.id,
                "custom_id": str(10_000_000 + i), "status": "completed",
                "output": f"summary {i}", "finish_reason": "stop",
                "usage": {"prompt_tokens": 20, "completion_tokens": 3}}
                for i in range(start, min(hi, start + 2000))])

    finish(0, n // 2)
    with Peak() as m:
        row, after, partial = store.require_batch(b.id), None, 0
        while True:
            page = read_page(store, row, after=after, default_model="tiny", settle_s=0.0)
            partial += len(page.lines)
            after = page.next_after
            if not page.has_more:
                break
    results["partial results at half-way"] = {**m.__dict__, "lines": partial}
    assert partial == n // 2
    finish(n // 2, n)
    out = work / "out.parquet"
    with Peak() as m:
        rows = write_results(store, store.require_batch(b.id), out)
    results["results -> Parquet"] = {**m.__dict__, "rows": rows,
                                     "row_groups": pq.ParquetFile(out).metadata.num_row_groups}
    ids = pq.read_table(out, columns=["doc_id", "status"])
    assert rows == n and ids.num_rows == n
    assert sorted(ids.column("doc_id").to_pylist()) == list(range(10_000_000, 10_000_000 + n))
    assert set(ids.column("status").to_pylist()) == {"completed"}
    print(f"\n{n:,}-row Parquet table ({src.stat().st_size / 2**20:.1f} MiB, 10,000-row groups), "
          f"store {store.dialect}; peak RSS above each phase's start (sampled every 5 ms)\n")
    print("| phase | seconds | RSS at start (MiB) | peak above start (MiB) |")
    print("| --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['seconds']:.1f} | {r['start']:.0f} | {r['peak'] - r['start']:.0f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {k: {kk: vv for kk, vv in v.items() if kk not in ("t", "stop")}
             for k, v in results.items()}, indent=1, default=str))
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
