"""The curl examples of README.md and docs/http-api.md run as written, against the live
stack: each shell block's variable lines and curl lines go to bash unchanged except for
the placeholders a reader fills in (the key `inf_...`, the host `localhost:8000`, and a
request `ID` from the first answer). Each answer is a success, not an error body."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.broker,
              pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")]

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "http-api.md"]
FENCE = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.S | re.M)


def curl_blocks(text: str) -> list[list[str]]:
    """Per shell block that calls curl: its variable assignments and curl lines."""
    blocks = []
    for body in FENCE.findall(text):
        lines = [ln for ln in body.splitlines()
                 if ln.startswith("curl ") or re.match(r"^[A-Z]+=", ln)]
        if any(ln.startswith("curl ") for ln in lines):
            blocks.append(lines)
    return blocks


def test_the_pages_have_curl_examples():
    for page in PAGES:
        assert curl_blocks(page.read_text()), page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_curl_examples_run_as_written(stack, page):
    if stack.store.dialect != "sqlite":
        pytest.skip("one backend is enough for the examples")
    key = stack.new_key("docs")
    host = stack.url.removeprefix("http://")
    for block in curl_blocks(page.read_text()):
        env_lines = [ln.replace("inf_...", key.token) for ln in block if not ln.startswith("curl ")]
        rid = None
        for line in (ln for ln in block if ln.startswith("curl ")):
            cmd = line.replace("localhost:8000", host)
            if re.search(r"/ID\b", cmd):
                assert rid is not None, f"{page.name}: {line!r} needs an id from an earlier line"
                cmd = re.sub(r"/ID\b", f"/{rid}", cmd)
            script = "\n".join(env_lines + [cmd.split("  #")[0]])
            out = subprocess.run(["bash", "-c", script], capture_output=True, timeout=120,
                                 check=False)
            assert out.returncode == 0, (line, out.stderr)
            text = out.stdout.decode()
            if " -sN " in line:  # SSE: token events, then the final one
                assert "event: final" in text, (line, text[-500:])
                continue
            body = orjson.loads(text)
            assert set(body) != {"error"}, (line, body)  # not an error answer
            if "/v1/requests -d" in line:
                rid = body["id"]
