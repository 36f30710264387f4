"""`inflight quantize`: a loadable folder with per-layer progress, and clear errors."""

from __future__ import annotations

import json
import shutil

import orjson
import pytest

from tests.tiny_llama import SENTENCES, write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama", num_layers=2, hidden_size=64)


def run(capsys, *argv) -> tuple[int, str, str]:
    from inflight.cli.main import main

    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_quantize_writes_a_folder_the_engine_loads(tiny, tmp_path, capsys):
    from inflight.engine import Engine, EngineConfig, SamplingParams

    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(SENTENCES * 20))
    out = tmp_path / "w4"
    rc, stdout, stderr = run(capsys, "quantize", tiny, "-o", out, "--scheme", "w4", "--group-size", 32,
                             "--method", "gptq", "--calib", calib, "--samples", 4, "--seq-len", 16, "--json")
    assert rc == 0, stderr
    assert [line.split(":")[0] for line in stderr.splitlines() if line.startswith("layer")] == \
        ["layer 1/2", "layer 2/2"]
    info = orjson.loads(stdout)
    assert info["model_path"] == str(out) and info["scheme"] == "w4" and info["group_size"] == 32
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert (q["scheme"], q["bits"], q["group_size"], q["method"]) == ("w4", 4, 32, "gptq")
    assert q["calibration"]["text"] == str(calib) and q["calibration"]["samples"] == 4
    assert {"tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= {f.name for f in out.iterdir()}
    eng = Engine(EngineConfig(model=out, num_kv_blocks=32))
    outs = eng.generate(["hello world"], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(outs[0].token_ids) == 4


def test_quantize_refuses_what_it_cannot_do(tiny, tmp_path, capsys):
    done = tmp_path / "w8"
    assert run(capsys, "quantize", tiny, "-o", done, "--scheme", "w8")[0] == 0

    def refused(*argv) -> str:
        rc, _, err = run(capsys, "quantize", *argv)
        assert rc == 2, err
        return err

    assert "already quantized" in refused(done, "-o", tmp_path / "again", "--scheme", "w4")
    assert "already exists" in refused(tiny, "-o", done, "--scheme", "w8")
    assert "group size 100" in refused(tiny, "-o", tmp_path / "x", "--scheme", "w4", "--group-size", 100)
    assert "no group size" in refused(tiny, "-o", tmp_path / "x", "--scheme", "w8", "--group-size", 32)
    assert "--calib is for --method gptq" in refused(tiny, "-o", tmp_path / "x", "--scheme", "w8",
                                                     "--calib", tmp_path / "nothing.txt")
    other = tmp_path / "gpt2"
    shutil.copytree(tiny, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(cfg, architectures=["GPT2LMHeadModel"])))
    assert "'GPT2LMHeadModel' is not supported" in refused(other, "-o", tmp_path / "x", "--scheme", "w8")
    (other / "config.json").write_text(json.dumps(dict(cfg, quantization_config={"quant_method": "awq"})))
    assert "quantized by another tool" in refused(other, "-o", tmp_path / "x", "--scheme", "w8")
    assert not (tmp_path / "x").exists()
