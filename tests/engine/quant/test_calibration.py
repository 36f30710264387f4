"""The default GPTQ calibration: the model's own chat answers plus stdlib docstrings; and the
benchmark's out-of-domain text is none of it."""

from __future__ import annotations

import json
import pathlib
import re

from inflight.engine.quant.calibration import (EVALUATION_MODULES, GENERATED_SHARE, _collect, code_text,
                                               default_calibration, docstring_text, heldout_text)
from inflight.engine.quant.calibration_prompts import PROMPTS
from inflight.engine.quant import self_text
from inflight.engine.quant.self_text import generate_windows, spread
from inflight.engine.tokenizer import Tokenizer
from tests.quant_models import quantized

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_spread_takes_every_kind_of_prompt():
    assert spread(tuple(range(96)), 4) == [0, 24, 48, 72]
    assert spread(PROMPTS, len(PROMPTS)) == list(PROMPTS)
    assert len(set(PROMPTS)) == len(PROMPTS) >= 64


def test_default_calibration_is_generated_chat_then_docstrings(tiny_model_path):
    tok = Tokenizer(tiny_model_path)
    windows, info = default_calibration(tiny_model_path, tok.encode, 8, 24, progress=lambda s: None)
    n_gen = round(8 * GENERATED_SHARE)
    assert len(windows) == 8 and all(len(w) == 24 for w in windows)
    assert info["generated"]["windows"] == n_gen and info["docstrings"]["windows"] == 8 - n_gen
    start = tok.hf.token_to_id("<|im_start|>")
    assert windows[0][0] == start  # a conversation through the chat template opens the text
    gen_ids = [t for w in windows[:n_gen] for t in w]
    assert gen_ids.count(start) >= 2  # the user turn and the model's answer
    docs = docstring_text()
    assert all(tok.decode(w) in docs for w in windows[n_gen:])
    assert tok.decode(windows[n_gen] + windows[n_gen + 1]) in docs  # consecutive pieces
    self_text._made.clear()  # generate again, not from the process's cache
    again = generate_windows(tiny_model_path, n_gen, 24, progress=lambda s: None)
    assert again.windows == windows[:n_gen]  # seeded: the same text every run
    assert info["generated"]["tokens_sha256_16"] == again.info["tokens_sha256_16"]


def test_quantized_folder_records_the_calibration(tiny_model_path, tmp_path):
    q = quantized(tiny_model_path, tmp_path / "q", "w4", 32, "gptq")
    cal = json.loads((q / "config.json").read_text())["quantization"]["calibration"]
    assert cal["text"] == "self-generated+python-stdlib-docstrings"
    assert cal["generated"]["chat_template"] is True and cal["generated"]["windows"] >= 1


def test_heldout_prose_is_unseen_by_the_calibration():
    """No 8-word run of the out-of-domain prose occurs in the docstrings or the prompts
    (what the model generates from the prompts is not checked here: it is sampled)."""
    def grams(text: str) -> set[tuple[str, ...]]:
        words = re.findall(r"[a-z']+", text.lower())
        return {tuple(words[i:i + 8]) for i in range(len(words) - 7)}

    prose = heldout_text(ROOT / "benchmarks" / "heldout" / "prose.txt")
    seen = grams(docstring_text()) | grams(" ".join(PROMPTS))
    shared = grams(prose) & seen
    assert len(grams(prose)) > 4000 and not shared, sorted(shared)[:3]


def test_out_of_domain_texts_hold_no_calibration_or_docstring_text(tmp_path):
    """The benchmark's code text is code: no docstring of its files survives in it, nor a
    comment line; the prose loader drops its provenance header and nothing else."""
    code = code_text()
    lines = code.splitlines()
    assert len(code) > 200_000 and "def " in code and "class " in code
    assert not any(line.lstrip().startswith("#") for line in lines)
    firsts = [d.splitlines()[0].strip()[:40] for d in _collect(EVALUATION_MODULES)]
    firsts = [f for f in firsts if len(f) == 40]  # a docstring's opening words, unindented
    assert len(firsts) > 100 and not [f for f in firsts if f in code]
    f = tmp_path / "t.txt"
    f.write_text("# where it comes from\n# more\n\nTitle\n\n# not a header: text\nbody\n")
    assert heldout_text(f) == "Title\n\n# not a header: text\nbody\n"
    prose = heldout_text(ROOT / "benchmarks" / "heldout" / "prose.txt")
    assert prose.startswith("The Lighthouse Keeper's Daughter") and "Provenance" not in prose
