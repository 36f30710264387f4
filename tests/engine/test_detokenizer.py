"""Text that always equals its tokens: the final text is `output_text`, a pure function of
the final tokens, and the streamed deltas always add up to it.

Random token sequences over two real tokenizers: the byte-level BPE of the tiny test
model (every byte is a token, so CJK characters and emoji come split over several tokens,
and random bytes make invalid UTF-8) and a SentencePiece-style one (Metaspace, byte
fallback `<0xE4>` pieces, a leading-space rule), both with special tokens in the mix.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.engine import Engine, EngineConfig, SamplingParams
from inflight.engine.detokenizer import IncrementalDetokenizer, output_text
from inflight.engine.tokenizer import Tokenizer
from tests.tiny_llama import build_tokenizer

MULTI_BYTE = "中文字符 ünï 🙂🚀 日本語 한국어 "


def _byte_level(folder):
    tok = build_tokenizer(320)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return Tokenizer(folder)


def _sentencepiece(folder):
    """Llama 2's decoder shape: Metaspace pieces, <0xXX> byte fallback, leading space cut."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in ["▁", "▁the", "▁a", "h", "e", "l", "o", "▁hello", "中", "文", "ü", "▁日本",
                  "s", "t", "▁x", "y"]:
        vocab[piece] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return Tokenizer(folder)


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tok(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return (_byte_level if request.param == "byte_level" else _sentencepiece)(folder)


def _ids(tok: Tokenizer):
    """Token ids: any id (specials, lone bytes), or a real text's tokens (multi-byte
    characters split over byte tokens), mixed."""
    V = tok.vocab_size
    text_ids = tok.encode(MULTI_BYTE, add_special_tokens=False)
    any_id = st.integers(0, V - 1)
    run = st.lists(st.sampled_from(text_ids), min_size=1, max_size=6)
    return st.lists(st.one_of(any_id.map(lambda t: [t]), run), max_size=12).map(
        lambda parts: [t for p in parts for t in p])


def _stream(tok, prompt, ids, stop=(), stop_token_ids=(), eos=()):
    """What the engine does: deltas token by token (stopping as it would), then the final
    text from the tokens and the last delta."""
    det = IncrementalDetokenizer(tok, prompt, stop)
    deltas, out = [], []
    for t in ids:
        out.append(t)
        if t in eos or t in stop_token_ids:
            break
        if det.add_token(t):
            break
        deltas.append(det.take_delta(False))
    text, hit = output_text(tok, det.context, out, stop, stop_token_ids, eos)
    deltas.append(det.finish(text))
    return out, deltas, text, hit


SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(data=st.data())
def test_deltas_add_up_to_the_decoded_tokens(tok, data):
    prompt = data.draw(_ids(tok), "prompt")
    ids = data.draw(_ids(tok), "ids")
    out, deltas, text, hit = _stream(tok, prompt, ids)
    assert out == ids and hit is None
    assert "".join(deltas) == text
    if not prompt:  # without context: exactly the tokenizer's decode
        assert text == tok.decode(ids)
    # no context rule on a byte-level tokenizer: the decode of the tokens alone
    if tok.hf.decoder.__class__.__name__ == "ByteLevel":
        assert text == tok.decode(ids)
    # a pure function of the tokens: recomputing gives the same
    det = IncrementalDetokenizer(tok, prompt)
    assert output_text(tok, det.context, ids) == (text, None)


@SETTINGS
@given(data=st.data())
def test_stops_cut_the_decoded_text(tok, data):
    prompt = data.draw(_ids(tok), "prompt")
    ids = data.draw(_ids(tok), "ids")
    stop = data.draw(st.lists(st.sampled_from(["中", "e", "🙂", " ", "ü", "\ufffd", "文字", "he"]),
                              max_size=3), "stop")
    stop_ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=2), "stop_ids")
    eos = tok.eos_token_ids
    out, deltas, text, hit = _stream(tok, prompt, ids, tuple(stop), tuple(stop_ids), eos)
    assert "".join(deltas) == text
    assert not any(s in text for s in stop)
    assert all(not any(s in d for s in stop) for d in deltas)
    plain = output_text(tok, IncrementalDetokenizer(tok, prompt).context, out)[0]
    if out and (out[-1] in stop_ids or out[-1] in eos):  # a stop token adds no text
        plain = output_text(tok, IncrementalDetokenizer(tok, prompt).context, out[:-1])[0]
    assert plain.startswith(text)
    if hit is not None:
        assert plain[len(text):].startswith(hit)


def test_trailing_split_character_is_in_the_final_text(tok):
    """The output ends inside a character: the deltas held it back, the final text has the
    U+FFFD a decode of the tokens gives (it used to be dropped)."""
    ids = tok.encode("ab中", add_special_tokens=False)
    cut = ids[:-1] if tok.decode(ids[:-1]).endswith("\ufffd") else ids
    out, deltas, text, _ = _stream(tok, [], cut)
    assert text == tok.decode(cut) and "".join(deltas) == text


def test_engine_final_text_is_its_tokens_decoded(tiny_model_path, prompts):
    """Sampled outputs of the tiny model (random bytes, split characters, specials): every
    request's deltas add up to its final text, which is its tokens decoded."""
    eng = Engine(EngineConfig(model=tiny_model_path, num_kv_blocks=128, debug_checks=True))
    tok = eng.tokenizer
    params = [SamplingParams(max_tokens=24, temperature=1.5, seed=i, ignore_eos=i % 2 == 0)
              for i in range(8)]
    for i, p in enumerate(params):
        eng.add_request(f"r{i}", prompt_token_ids=prompts[i], params=p)
    deltas: dict[str, list[str]] = {}
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            deltas.setdefault(out.request_id, []).append(out.text_delta)
            if out.finished:
                finals[out.request_id] = out
    for i, p in enumerate(params):
        f = finals[f"r{i}"]
        ids = list(f.token_ids)
        if f.finish_reason == "stop" and ids[-1] in tok.eos_token_ids:
            ids = ids[:-1]
        assert "".join(deltas[f"r{i}"]) == f.text == tok.decode(ids)
