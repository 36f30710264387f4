"""How a reader sees one request's events from two topics: deltas in order, a new attempt
starts the text over (never mixed), the final fills in whatever the deltas did not bring."""

from __future__ import annotations

from inflight.producers.stream import StreamAssembler
from inflight.schemas import ErrorEvent, FinalEvent, StatusEvent, TokenEvent

RID = "r-1"


def tok(attempt, index, start, ids, text):
    return TokenEvent(request_id=RID, attempt=attempt, index=index, start=start, token_ids=ids,
                      text=text)


def final(attempt, ids, text):
    return FinalEvent(request_id=RID, attempt=attempt, text=text, token_ids=ids,
                      finish_reason="stop")


def run(*events):
    asm, out = StreamAssembler(), []
    for ev in events:
        out += asm.feed(ev)
    return out


def text_of(stream):
    """What a reader ends with: deltas since the last index 0."""
    text = ""
    for ev in stream:
        if isinstance(ev, TokenEvent):
            text = ev.text if ev.index == 0 else text + ev.text
    return text


def test_deltas_in_order_then_the_final():
    out = run(StatusEvent(request_id=RID, attempt="a"), tok("a", 1, 2, [3], "c"),
              tok("a", 0, 0, [1, 2], "ab"), tok("a", 0, 0, [1, 2], "ab"),
              final("a", [1, 2, 3], "abc"), tok("a", 2, 3, [4], "late"))
    assert [(e.type, getattr(e, "index", None)) for e in out] == [
        ("token", 0), ("token", 1), ("final", None)]
    assert text_of(out) == out[-1].text == "abc"


def test_the_final_brings_what_the_deltas_did_not():
    out = run(tok("a", 0, 0, [1], "a"), final("a", [1, 2, 3], "abc"))
    assert [e.type for e in out] == ["token", "token", "final"]
    assert out[1].index == 1 and out[1].start == 1 and out[1].token_ids == [2, 3]
    assert text_of(out) == "abc"
    # a request that did not stream (or whose deltas are gone): one delta with everything
    out = run(StatusEvent(request_id=RID, attempt="a"), final("a", [1, 2], "ab"))
    assert [(e.type, getattr(e, "index", None)) for e in out] == [("token", 0), ("final", None)]
    assert out[0].token_ids == [1, 2] and text_of(out) == "ab"


def test_a_new_attempt_starts_over_and_is_never_mixed():
    out = run(tok("a", 0, 0, [1], "x"), tok("a", 1, 1, [2], "y"),
              tok("b", 0, 0, [7], "p"),          # attempt b (a redo elsewhere) takes over
              tok("a", 2, 2, [3], "z"),          # a's late delta: ignored
              tok("b", 1, 1, [8], "q"), final("b", [7, 8, 9], "pqr"))
    assert [(e.attempt, e.index) for e in out if e.type == "token"] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]
    assert text_of(out) == "pqr" and out[-1].attempt == "b"


def test_the_first_final_of_another_attempt_wins_in_full():
    out = run(tok("b", 0, 0, [7], "p"), final("a", [1, 2], "ab"))
    assert [(e.type, getattr(e, "index", None), e.attempt) for e in out] == [
        ("token", 0, "b"), ("token", 0, "a"), ("final", None, "a")]
    assert text_of(out) == "ab"


def test_an_error_final_ends_the_stream():
    err = ErrorEvent(request_id=RID, attempt="a", code="engine_error", message="boom")
    out = run(tok("a", 0, 0, [1], "a"), err, final("a", [1], "a"))
    assert out == [out[0], err]
