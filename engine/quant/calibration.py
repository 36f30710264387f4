"""GPTQ's calibration windows, and the held-out docstrings the benchmark scores.

The default calibration has two domains, so that the Hessians are not those of one kind of
text (calibrated on docstrings alone, GPTQ w4 was no better than round-to-nearest on
English prose):

- the model's own answers to varied chat prompts, through its chat template
  (engine/quant/self_text.py): GENERATED_SHARE of the windows;
- the standard library's own docstrings (English prose with some code), read from the
  source files of CALIBRATION_MODULES with `ast` (nothing is imported or executed).

`--calib FILE` replaces both with the windows of one text file.

Evaluation (perplexity, held out; benchmarks/quantization.py):

- in-domain: the docstrings of EVALUATION_MODULES, a disjoint list of files; any docstring
  that also occurs in the calibration text (e.g. "Return self==value.") is dropped, so no
  passage is in both (`evaluation_text`);
- out of domain: English prose (benchmarks/heldout/prose.txt, `heldout_text`: written for
  the benchmark, not by any model being quantized, on topics the chat prompts avoid) and
  the *code* of EVALUATION_MODULES with every docstring and comment removed (`code_text`).

Both lists are fixed; the text itself is that of the running Python's standard library
(3.11 on the dev box), so `text_digest` is recorded beside every figure and in a quantized
folder's config.json. Files missing from another Python version are skipped.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import pathlib
import sysconfig
from typing import Callable, Sequence

from inflight.engine.errors import ConfigError

GENERATED_SHARE = 0.75  # of the default calibration windows; the rest are docstrings
DEFAULT_CALIBRATION = "self-generated+python-stdlib-docstrings"  # config.json's calibration.text
CALIBRATION_VERSION = 2  # bumped whenever the default calibration's recipe changes

CALIBRATION_MODULES = (
    "typing.py", "argparse.py", "dataclasses.py", "functools.py", "subprocess.py",
    "threading.py", "logging/__init__.py", "json/__init__.py", "email/message.py",
    "unittest/case.py", "inspect.py", "enum.py", "tarfile.py", "shutil.py", "os.py",
    "collections/__init__.py", "asyncio/events.py", "asyncio/tasks.py", "http/client.py",
    "urllib/request.py", "socket.py", "ssl.py", "doctest.py", "optparse.py", "codecs.py",
    "locale.py", "mailbox.py", "queue.py", "heapq.py", "pydoc.py", "traceback.py", "ast.py",
    "sched.py", "selectors.py", "http/server.py", "email/utils.py", "multiprocessing/pool.py",
)
EVALUATION_MODULES = (
    "_pydecimal.py", "statistics.py", "fractions.py", "difflib.py", "calendar.py", "random.py",
    "textwrap.py", "string.py", "configparser.py", "smtplib.py", "ftplib.py", "imaplib.py",
    "pickle.py", "csv.py", "bisect.py", "tempfile.py", "glob.py", "fnmatch.py", "contextlib.py",
    "copy.py", "weakref.py", "numbers.py", "gettext.py", "pprint.py", "shlex.py", "zipimport.py",
)


def stdlib_dir() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def docstrings(path: pathlib.Path) -> list[str]:
    """Module, class and function docstrings of one source file, in source order."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = [tree] + [n for n in ast.walk(tree)
                      if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    out = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=False)
        if doc and len(doc.split()) >= 4:  # one-word stubs carry no language
            out.append(inspect.cleandoc(doc))
    return out


@functools.lru_cache(maxsize=4)
def _collect(modules: tuple[str, ...], exclude: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Unique docstrings of `modules` (not in `exclude`), in file and source order."""
    root = stdlib_dir()
    seen: set[str] = set(exclude)
    out = []
    for rel in modules:
        path = root / rel
        if not path.is_file():
            continue
        for doc in docstrings(path):
            if doc not in seen:
                seen.add(doc)
                out.append(doc)
    return tuple(out)


def docstring_text() -> str:
    return "\n\n".join(_collect(CALIBRATION_MODULES))


def evaluation_text() -> str:
    return "\n\n".join(_collect(EVALUATION_MODULES, frozenset(_collect(CALIBRATION_MODULES))))


def code_text() -> str:
    """The source of EVALUATION_MODULES without docstrings, comments or blank lines: Python
    code, a domain the calibration sees only in the docstrings' short examples."""
    root = stdlib_dir()
    out = []
    for rel in EVALUATION_MODULES:
        path = root / rel
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        drop: set[int] = set()
        tree = ast.parse(source, filename=str(path))
        for node in [tree] + [n for n in ast.walk(tree) if isinstance(
                n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]:
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                drop.update(range(body[0].lineno - 1, body[0].end_lineno))
        kept = [ln for i, ln in enumerate(lines) if i not in drop and ln.strip()
                and not ln.lstrip().startswith("#")]
        out.append("\n".join(kept))
    return "\n\n".join(out)


def heldout_text(path: str | pathlib.Path) -> str:
    """A text file of benchmarks/heldout/ without its header (the leading lines that start
    with '#', which say where the text comes from)."""
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or (i > 0 and not lines[i].strip()
                                                            and lines[i - 1].startswith("#"))):
        i += 1
    return "\n".join(lines[i:]).strip() + "\n"


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def token_windows(encode: Callable[[str], Sequence[int]], text: str, num_windows: int,
                  window: int, what: str = "calibration") -> list[list[int]]:
    """The first `num_windows` consecutive, non-overlapping `window`-token pieces of `text`."""
    ids = list(encode(text))
    have = len(ids) // window
    if have < num_windows:
        raise ConfigError(f"the {what} text has {len(ids)} tokens: {have} windows of {window}, "
                          f"{num_windows} asked; give a longer text (--calib FILE) or fewer/shorter samples")
    return [ids[i * window:(i + 1) * window] for i in range(num_windows)]


def default_calibration(folder, encode: Callable[[str], Sequence[int]], num_windows: int,
                        seq_len: int, *, device: str = "cpu",
                        progress: Callable[[str], None] = print) -> tuple[list[list[int]], dict]:
    """The default calibration windows (generated answers first, then docstrings) and
    their provenance for config.json."""
    from inflight.engine.quant.self_text import generate_windows

    n_gen = round(num_windows * GENERATED_SHARE)
    gen = generate_windows(folder, n_gen, seq_len, device=device, progress=progress)
    text = docstring_text()
    docs = token_windows(encode, text, num_windows - n_gen, seq_len) if num_windows > n_gen else []
    info = {"text": DEFAULT_CALIBRATION, "version": CALIBRATION_VERSION, "samples": num_windows, "seq_len": seq_len,
            "generated": dict(gen.info, windows=n_gen),
            "docstrings": {"windows": len(docs), "text_sha256_16": text_digest(text)}}
    return gen.windows + docs, info
