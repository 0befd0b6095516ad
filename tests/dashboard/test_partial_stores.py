"""Every page on a store of one traced layer (client only, gateway only, engine only) and on a store
of one request, each written by the real collector: no exception, no error, and what cannot be shown
is said rather than drawn from an empty series (a histogram of nothing once raised on Distributions,
and the Request explorer offered a request "nan")."""

from __future__ import annotations

from tests.dashboard.apptest_util import PAGES, goto, metrics, open_app


def test_every_page_renders_on_a_partial_store(partial_store, monkeypatch):
    name, db = partial_store
    at = open_app(monkeypatch, db=db)
    assert not at.exception, (name, at.exception)
    for page in PAGES:
        goto(at, page)
        assert not at.exception, (name, page, [e.value for e in at.exception])
        assert not at.error, (name, page, [e.value for e in at.error])
        if page == "explorer":
            picks = [s for s in at.selectbox if s.key == "ex_pick"]
            assert all("nan" not in str(o) for s in picks for o in s.options), (name, picks[0].options)
    shown = metrics(goto(at, "overview"))
    assert shown["Requests"] == ("1" if name == "one-request" else "30"), (name, shown)
