"""Owner-scoped request queries of the HTTP API (store/owner_queries.py), on SQLite and Postgres."""

from __future__ import annotations

from inflight.schemas import FinalEvent, InferenceRequest
from inflight.store import Store, final_row, queued_row
from inflight.store.owner_queries import claim_requests, release_request, request_view
from tests.store.owner_rows import claim_request


def test_claim_inserts_once_and_reports_the_existing_row(store: Store):
    req = InferenceRequest(request_id="c1", prompt="hello")
    assert claim_request(store, queued_row(req), "alice") is None
    again = claim_request(store, queued_row(InferenceRequest(request_id="c1", prompt="other")), "bob")
    assert again is not None and (again.id, again.owner, again.status) == ("c1", "alice", "queued")
    assert store.get_request("c1").prompt == "hello"


def test_owner_survives_the_recorders_rows(store: Store):
    req = InferenceRequest(request_id="c2", prompt="hello")
    claim_request(store, queued_row(req), "alice")
    store.upsert_requests([queued_row(req)])  # the recorder's copy, without owner
    store.upsert_requests([final_row(FinalEvent(request_id="c2", text="hi", finish_reason="stop"))])
    view = request_view(store, "c2")
    assert (view.owner, view.status, view.output) == ("alice", "completed", "hi")
    assert request_view(store, "nope") is None


def test_release_removes_only_an_unstarted_row_of_its_owner(store: Store):
    for rid in ("c3", "c4"):
        claim_request(store, queued_row(InferenceRequest(request_id=rid, prompt="x")), "alice")
    release_request(store, "c3", "bob")
    assert request_view(store, "c3") is not None
    release_request(store, "c3", "alice")
    assert request_view(store, "c3") is None
    store.upsert_requests([final_row(FinalEvent(request_id="c4", text="hi", finish_reason="stop"))])
    release_request(store, "c4", "alice")
    assert request_view(store, "c4").status == "completed"


def test_claim_many_in_one_transaction(store: Store):
    def row(rid: str, prompt: str = "x"):
        return queued_row(InferenceRequest(request_id=rid, prompt=prompt))

    claim_request(store, row("m0"), "bob")
    got = claim_requests(store, [(row("m1"), "alice"), (row("m0"), "alice"),
                                 (row("m2", "first"), "alice"), (row("m2", "second"), "carol")])
    assert got[0] is None and got[2] is None                       # inserted by this call
    assert (got[1].id, got[1].owner) == ("m0", "bob")              # there before
    assert (got[3].id, got[3].owner) == ("m2", "alice")            # the first of two wins
    assert store.get_request("m2").prompt == "first"


def test_views_of_many_ids_in_one_select(store: Store):
    from inflight.store.owner_queries import request_views

    for rid, owner in (("v1", "alice"), ("v2", "bob")):
        claim_request(store, queued_row(InferenceRequest(request_id=rid, prompt="x")), owner)
    store.upsert_requests([final_row(FinalEvent(request_id="v2", text="hi", finish_reason="stop"))])
    views = request_views(store, ["v2", "v1", "nope", "v1"])
    assert sorted(views) == ["v1", "v2"] and request_views(store, []) == {}
    assert (views["v1"].owner, views["v1"].status) == ("alice", "queued")
    assert (views["v2"].owner, views["v2"].output) == ("bob", "hi")
    assert views["v2"] == request_view(store, "v2")
