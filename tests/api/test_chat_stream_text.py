"""A streamed chat completion across a redo (Client.stream starts the text over)."""

from api.routes.chat import SentText
from schemas import TokenEvent


def ev(index: int, text: str) -> TokenEvent:
    return TokenEvent(request_id="r", attempt="a", index=index, start=0, token_ids=[], text=text)


def test_a_redo_that_repeats_the_text_sends_only_what_is_new():
    t = SentText()
    assert [t.feed(ev(0, "Hel")), t.feed(ev(1, "lo"))] == ["Hel", "lo"]
    assert t.feed(ev(0, "He")) == ""            # the redo catches up...
    assert t.feed(ev(1, "llo wor")) == " wor"   # ...and goes on past what was sent
    assert t.feed(ev(2, "ld")) == "ld" and t.sent == "Hello world"


def test_a_redo_that_diverges_is_refused():
    t = SentText()
    t.feed(ev(0, "Hello"))
    assert t.feed(ev(0, "Goodbye")) is None
