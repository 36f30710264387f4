"""README.md and docs/ follow the files they describe.

Checked against the code itself, not a copy of it: every `inflight ...` command shown in a
code block parses with the real argparse parser; every INFLIGHT_* name is a Settings field
and every Settings field is in docs/configuration.md; every metric named in
docs/deployment.md is one the worker or the recorder exports; every file path, `inflight.*`
module and relative link named in the docs exists. Each check is a function of the text,
and a test feeds it a mistake to show that it can fail.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from inflight.cli.main import build_parser
from inflight.schemas import Settings
from tests.deploy.files import INFLIGHT_NAME

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# Read by the tests and benchmark scripts, not by the service (docs/configuration.md says so).
NOT_SETTINGS = {"INFLIGHT_TEST_POSTGRES", "INFLIGHT_TEST_POSTGRES_URL", "INFLIGHT_TEST_REDIS",
                "INFLIGHT_TEST_REDIS_URL", "INFLIGHT_BENCH_PROFILE", "INFLIGHT_TEST_DEVICE",
                "INFLIGHT_TEST_DTYPE",
                # where kernels/cpu_native.py keeps its C++ build: a cache path, not a service setting
                "INFLIGHT_KERNELS_CACHE"}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
METRIC = re.compile(r"\b((?:vllm:|inflight_)[a-zA-Z0-9_:]+)")
PATH = re.compile(r"^(?:[\w.*-]+/)+[\w.*-]+\.(?:py|sh|json|yml|yaml|toml|md)$")
MODULE = re.compile(r"^inflight(?:\.\w+)+(?::\w+)?$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PYTHON_M = re.compile(r"python -m (inflight[\w.]*)")
FROM_IMPORT = re.compile(r"^from (inflight[\w.]*) import ([\w, ]+)", re.M)
SHELL_BREAK = {"|", "||", "&", "&&", ";", "(", ")", "$", ">", ">>", "<"}


def read(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def setting_names() -> set[str]:
    return {f"INFLIGHT_{name.upper()}" for name in Settings.model_fields}


# -- commands ------------------------------------------------------------------------------
def inflight_commands(text: str) -> list[list[str]]:
    """The argument lists of every `inflight ...` (or `python -m inflight ...`) command in
    the code blocks of `text`: shell words up to the next pipe, `&`, `;` or parenthesis."""
    commands = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            try:
                words = list(lexer)
            except ValueError:  # an unbalanced quote: not shell
                continue
            for i, word in enumerate(words):
                starts = (word == "inflight" or word.endswith("/inflight")) and (
                    i == 0 or words[i - 1] in SHELL_BREAK or "=" in words[i - 1])
                starts_m = word == "inflight" and i >= 2 and words[i - 1] == "-m"
                if starts or starts_m:
                    args = []
                    for w in words[i + 1:]:
                        if w in SHELL_BREAK:
                            break
                        args.append(w)
                    commands.append(args)
    return commands


def unparsable(commands: list[list[str]]) -> list[str]:
    bad = []
    for args in commands:
        try:
            build_parser().parse_args(args)
        except SystemExit:
            bad.append(" ".join(["inflight", *args]))
    return bad


def test_every_command_shown_parses_with_the_cli():
    commands = [c for page in PAGES for c in inflight_commands(read(page))]
    assert len(commands) > 30 and {c[0] for c in commands} >= {
        "broker", "worker", "recorder", "submit", "result", "stream", "cancel", "batch", "jobs",
        "api", "keys", "quantize", "db", "topics", "model"}
    assert unparsable(commands) == [], "see argparse's message above"


def test_the_command_check_catches_a_flag_that_does_not_exist(capsys):
    text = "```bash\ninflight worker --gpu 0 &   # no such flag\nX=1 inflight result ID --wait\n```\n"
    assert inflight_commands(text) == [["worker", "--gpu", "0"], ["result", "ID", "--wait"]]
    assert unparsable(inflight_commands(text)) == ["inflight worker --gpu 0"]
    assert "unrecognized arguments: --gpu" in capsys.readouterr().err


# -- settings ------------------------------------------------------------------------------
def unknown_variables(text: str) -> set[str]:
    return set(INFLIGHT_NAME.findall(text)) - setting_names() - NOT_SETTINGS


def undocumented_settings(text: str) -> set[str]:
    return setting_names() - set(INFLIGHT_NAME.findall(text))


def test_every_variable_named_is_a_setting():
    for page in PAGES:
        assert unknown_variables(read(page)) == set(), page.name


def test_every_setting_is_in_configuration_md():
    assert undocumented_settings(read(DOCS / "configuration.md")) == set()


def test_the_settings_checks_catch_mistakes():
    text = read(DOCS / "configuration.md")
    assert unknown_variables(text + "\n`INFLIGHT_KAFKA_BOOTSTRAPS`") == {"INFLIGHT_KAFKA_BOOTSTRAPS"}
    assert undocumented_settings(text.replace("INFLIGHT_BATCH_LEASE_S", "")) == {"INFLIGHT_BATCH_LEASE_S"}


# -- metrics -------------------------------------------------------------------------------
def unexported_metrics(text: str, exported: set[str]) -> set[str]:
    """Metric names in `text` that are neither exported samples nor the family of one
    (`vllm:e2e_request_latency_seconds` for its `_bucket`/`_sum`/`_count` samples)."""
    named = set(METRIC.findall(prose(text)))
    return {n for n in named
            if n not in exported and not any(n + s in exported for s in ("_bucket", "_sum", "_count"))}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    from tests.deploy.test_dashboard import exported_names

    return exported_names()


def test_every_metric_named_in_deployment_md_is_exported(exported):
    text = read(DOCS / "deployment.md")
    assert len(METRIC.findall(text)) > 15
    assert unexported_metrics(text, exported) == set()


def test_every_vllm_metric_is_in_deployment_md(exported):
    text = read(DOCS / "deployment.md")
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exported if n.startswith("vllm:")}
    assert families and {f for f in families if f not in text} == set()


def test_the_metrics_check_catches_a_name_the_code_does_not_export(exported):
    text = "| `vllm:num_requests_running` | gauge |\n| `inflight_worker_dlq` | counter |"
    assert unexported_metrics(text, exported) == {"inflight_worker_dlq"}


# -- paths, modules, links -----------------------------------------------------------------
def missing_paths(text: str) -> set[str]:
    """Backquoted repository paths (globs allowed) that match no file."""
    return {s for s in SPAN.findall(prose(text)) if PATH.match(s) and not list(ROOT.glob(s))}


def find_spec(module: str) -> object | None:
    try:
        return importlib.util.find_spec(module)
    except ImportError:  # a parent that is not a package
        return None


def missing_modules(text: str) -> set[str]:
    """Backquoted `inflight.x.y` names (or `inflight.x.y:attr`) that resolve to neither a
    module nor an attribute of one. Topic names (`inflight.requests`) are not modules."""
    bad = set()
    topics = set(Settings().topics())
    names = {s for s in SPAN.findall(text) if MODULE.match(s)} - topics
    names |= set(PYTHON_M.findall(text))
    for module, imported in FROM_IMPORT.findall(text):
        names |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
    for name in names:
        module, _, attr = name.partition(":")
        if find_spec(module) is not None:
            if attr and not hasattr(importlib.import_module(module), attr):
                bad.add(name)
            continue
        parent, _, attr = module.rpartition(".")
        try:
            if not hasattr(importlib.import_module(parent), attr):
                bad.add(name)
        except ImportError:
            bad.add(name)
    return bad


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def broken_links(page: Path, text: str) -> set[str]:
    bad = set()
    for link in LINK.findall(text):
        if re.match(r"^[a-z]+:", link):  # http:, https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            bad.add(link)
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", prose(path.read_text(encoding="utf-8")), re.M)
            if anchor not in {slug(h) for h in headings}:
                bad.add(link)
    return bad


def test_every_path_named_exists():
    for page in PAGES:
        assert missing_paths(read(page)) == set(), page.name


def test_every_inflight_module_named_exists():
    for page in PAGES:
        assert missing_modules(read(page)) == set(), page.name


def test_every_link_resolves():
    assert "docs/benchmarks.md" in read(ROOT / "README.md")
    for page in PAGES:
        assert broken_links(page, read(page)) == set(), page.name
    linked = {Path(l.partition("#")[0]).name for l in LINK.findall(read(ROOT / "README.md"))}
    assert {p.name for p in DOCS.glob("*.md")} <= linked, "a docs/ page the README does not link"


def test_the_path_module_and_link_checks_catch_mistakes():
    text = "`consumers/worker.py`, `consumers/wrker.py`, `kernels/quant*.py`, `inflight.consumers.wrker`"
    assert missing_paths(text) == {"consumers/wrker.py"}
    assert missing_modules(text + " `inflight.engine.Engine` `inflight.cli.main:main` "
                           "`inflight.results.tokens` `inflight.cli.main:mian` `inflight.nope.x`\n"
                           "python -m inflight.consumers.recorder, python -m inflight.consumer.worker\n"
                           "from inflight.producers import Client, Clinet\n") == {
        "inflight.consumers.wrker", "inflight.cli.main:mian", "inflight.nope.x",
        "inflight.consumer.worker", "inflight.producers.Clinet"}
    page = ROOT / "README.md"
    assert broken_links(page, "[a](docs/cli.md) [b](docs/nope.md) [c](docs/cli.md#no-such-part)") == {
        "docs/nope.md", "docs/cli.md#no-such-part"}
