"""Batch input lines: OpenAI and Anthropic lines, every error with its line number; the
result-line formats (no broker, no database)."""

from __future__ import annotations

import json

import orjson
import pytest

from inflight.producers.batch_lines import LineChecker, context_length, request_id_for
from inflight.producers.batch_output import anthropic_line, openai_line
from inflight.schemas import SchemaError, Settings

CHAT, COMPL, MSGS = "/v1/chat/completions", "/v1/completions", "/v1/messages"


def oa(cid="a", url=CHAT, **body):
    body.setdefault("messages" if url == CHAT else "prompt",
                    [{"role": "user", "content": "hi"}] if url == CHAT else "hi")
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def checker(endpoint=CHAT, context=64):
    return LineChecker("batch_x", endpoint, context=context, max_prompt_chars=1000,
                       max_line_bytes=10_000)


def test_openai_line_becomes_a_batch_request():
    cid, req = checker().check(1, oa("q 1/é", model="m", max_tokens=8, temperature=0, seed=3))
    assert cid == "q 1/é" and req.request_id == request_id_for("batch_x", "q 1/é")
    assert req.batch_id == "batch_x" and req.priority == 10 and req.stream is False
    assert req.params.max_tokens == 8 and req.params.seed == 3
    assert req.messages[0].content == "hi"
    _, req = checker(COMPL).check(2, oa("p", COMPL, prompt=[5, 6], max_tokens=4))
    assert req.prompt_token_ids == [5, 6]


def test_request_ids_are_stable_valid_and_distinct():
    assert request_id_for("b1", "row-7") == "b1:row-7"
    odd = request_id_for("b1", "has space")
    assert odd.startswith("b1::") and odd == request_id_for("b1", "has space")
    assert request_id_for("b1", "x" * 200) != request_id_for("b1", "x" * 201)
    assert request_id_for("b2", "row-7") != request_id_for("b1", "row-7")


@pytest.mark.parametrize("line,field,words", [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    (orjson.dumps({"method": "POST", "url": CHAT, "body": {}}), "custom_id", "custom_id"),
    (oa(url=COMPL), "url", "must use '/v1/chat/completions'"),
    (orjson.dumps({"custom_id": "a", "method": "GET", "url": CHAT, "body": {}}), "method", "POST"),
    (oa(beam_width=3), "body.beam_width", "unsupported parameter"),
    (oa(max_tokens=0), "body.max_tokens", "greater than or equal to 1"),
    (oa(max_tokens=65), "body.max_tokens", "context of 64"),
    (oa(n=2), "body.n", "not supported"),
    (orjson.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": {"max_tokens": 3}}),
     "body.messages", "missing"),
    (oa(messages=[{"role": "user", "content": "x" * 2000}]), "body.messages", "characters"),
])
def test_bad_openai_lines_name_line_and_field(line, field, words):
    with pytest.raises(SchemaError) as e:
        checker().check(7, line)
    assert e.value.message.startswith("line 7: ") and words in e.value.message
    assert e.value.field == field


def test_duplicate_custom_id_is_rejected_on_the_later_line():
    c = checker()
    c.check(1, oa("same"))
    with pytest.raises(SchemaError, match="line 2: custom_id 'same' appears on an earlier line"):
        c.check(2, oa("same"))
    c.check(3, oa("other"))


def test_anthropic_lines():
    line = orjson.dumps({"custom_id": "m1", "params": {
        "model": "claude", "max_tokens": 16, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                  {"type": "text", "text": "there"}]}],
        "stop_sequences": ["\n\n"], "temperature": 0.5, "metadata": {"user_id": "u"}}})
    cid, req = checker(MSGS).check(1, line)
    assert cid == "m1" and [m.role for m in req.messages] == ["system", "user"]
    assert req.messages[1].content == "Hi there" and req.params.stop == ("\n\n",)
    for params, field in [({"messages": [{"role": "user", "content": "x"}]}, "params.max_tokens"),
                          ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                            "tools": []}, "params.tools"),
                          ({"max_tokens": 5, "messages": [{"role": "user", "content": [
                              {"type": "image", "source": {}}]}]}, "params.messages.0.content.0"),
                          ({"max_tokens": 5, "messages": []}, "params.messages"),
                          ({"max_tokens": 99, "messages": [{"role": "user", "content": "x"}]},
                           "params.max_tokens"),
                          ({"max_tokens": 5, "temperature": -1,
                            "messages": [{"role": "user", "content": "x"}]}, "params.temperature")]:
        with pytest.raises(SchemaError) as e:
            checker(MSGS).check(4, orjson.dumps({"custom_id": "m", "params": params}))
        assert e.value.field == field and e.value.message.startswith("line 4: "), e.value.message


def test_context_length_without_loading_the_model(tmp_path):
    assert context_length(Settings(batch_context_length=77)) == 77
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert context_length(Settings(model_path=str(tmp_path))) == 4096
    assert context_length(Settings(), model_dir=tmp_path) == 4096
    assert context_length(Settings(), model_dir=tmp_path / "missing") is None
    assert context_length(Settings(max_model_len=1024), model_dir=tmp_path) == 1024


_DONE = {"status": "completed", "output": "hello", "finish_reason": "length",
         "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "error": None,
         "error_code": None, "finished_at": None}
_FAILED = {"status": "failed", "output": None, "finish_reason": "error", "usage": None,
           "error": "prompt is 600 tokens", "error_code": "prompt_too_long", "finished_at": None}


def test_openai_result_lines():
    line, err = openai_line("c", "b:c", _DONE, endpoint=CHAT, model="m", batch_status="completed")
    body = line["response"]["body"]
    assert not err and line["error"] is None and line["response"]["status_code"] == 200
    assert body["object"] == "chat.completion" and body["model"] == "m"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    line, _ = openai_line("c", "b:c", _DONE, endpoint=COMPL, model="m", batch_status="completed")
    assert line["response"]["body"]["choices"][0]["text"] == "hello"
    line, err = openai_line("c", "b:c", _FAILED, endpoint=CHAT, model="m", batch_status="completed")
    assert err and line["response"]["status_code"] == 400
    assert line["response"]["body"]["error"]["code"] == "prompt_too_long"
    for row, status, code in [(None, "expired", "batch_expired"), (None, "cancelled", "batch_cancelled"),
                              ({"status": "running"}, "expired", "batch_expired"),
                              ({"status": "expired"}, "expired", "batch_expired"),
                              ({"status": "cancelled"}, "cancelled", "batch_cancelled")]:
        line, err = openai_line("c", "b:c", row, endpoint=CHAT, model="m", batch_status=status)
        assert err and line["response"] is None and line["error"]["code"] == code


def test_anthropic_result_lines():
    ok = anthropic_line("c", "b:c", _DONE, model="m", batch_status="completed")
    msg = ok["result"]["message"]
    assert ok["result"]["type"] == "succeeded" and msg["content"] == [{"type": "text", "text": "hello"}]
    assert msg["stop_reason"] == "max_tokens" and msg["usage"] == {"input_tokens": 3, "output_tokens": 2}
    bad = anthropic_line("c", "b:c", _FAILED, model="m", batch_status="completed")
    assert bad["result"]["type"] == "errored"
    assert bad["result"]["error"]["error"]["type"] == "invalid_request_error"
    assert anthropic_line("c", "b:c", None, model="m", batch_status="expired")["result"] == {"type": "expired"}
    assert anthropic_line("c", "b:c", None, model="m", batch_status="cancelled")["result"] == {"type": "canceled"}


_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
_CUT_CALLS = [
    # (output cut at max_tokens, the text that may remain, the calls that came out whole)
    (_CALL + "\n" + _CALL[:-5], None, 2),                       # OpenAI batch: '</tool_'
    ('<tool_call>\n{"name": "get_weather", "arguments": {"ci', None, 0),  # Anthropic batch
    ("Checking.\n" + _CALL[:25], "Checking.", 0)]


@pytest.mark.parametrize("output, text, n_calls", _CUT_CALLS)
def test_result_lines_of_a_cut_tool_call_hold_no_markup(output, text, n_calls):
    """A call cut by max_tokens (issue 36): no `<tool_call>` / `</tool_` in the content or
    a text block; the whole calls stay; finish_reason length / stop_reason max_tokens."""
    row = {**_DONE, "output": output, "finish_reason": "length",
           "tool_calls": [{"id": f"call_{i}", "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Paris"}'}}
               for i in range(n_calls)] or None}
    line, _ = openai_line("c", "b:c", row, endpoint=CHAT, model="m", batch_status="completed",
                          tools=True)
    choice = line["response"]["body"]["choices"][0]
    assert choice["message"]["content"] == text and choice["finish_reason"] == "length"
    assert len(choice["message"].get("tool_calls") or []) == n_calls
    msg = anthropic_line("c", "b:c", row, model="m", batch_status="completed",
                         tools=True)["result"]["message"]
    texts = [b["text"] for b in msg["content"] if b["type"] == "text"]
    assert texts == ([text] if text else []) and msg["stop_reason"] == "max_tokens"
    assert [b["name"] for b in msg["content"] if b["type"] == "tool_use"] == ["get_weather"] * n_calls
    assert not any("<tool" in t or "</" in t for t in texts)
