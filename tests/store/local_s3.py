"""A local S3 server (moto's server mode, the dev dependency) for file-storage tests:
`local_s3` (module scope) starts it with a bucket and AWS_* test credentials; `s3_url()`
gives each test a prefix of its own."""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="module")
def local_s3(tmp_path_factory):
    pytest.importorskip("moto", reason='the local S3 server needs "moto[server]"')
    from inflight.cli.broker_storage import LocalS3
    from inflight.cli.broker import free_port

    creds = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
             "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)
    s3 = LocalS3(free_port(), bucket="files",
                 log_path=tmp_path_factory.mktemp("s3") / "s3.log").start()
    try:
        yield s3
    finally:
        s3.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def s3_url(s3) -> str:
    return f"s3://{s3.bucket}/t-{uuid.uuid4().hex[:8]}"
