"""A dashboard link's window (`dashboard.ui.link_window`): what an alert's notification or a
"Why is it slow?" finding puts in the URL becomes the sidebar's time range."""

from __future__ import annotations

import datetime as dt

import pytest

from tailtrace.dashboard.data import DataError
from tailtrace.dashboard.ui import link_window


def test_since_until_in_utc_whatever_the_offset():
    since, until, label = link_window({"since": "2026-12-01T16:30:00+01:00", "until": "2026-12-01T15:45:00"})
    assert (since, until) == (dt.datetime(2026, 12, 1, 15, 30), dt.datetime(2026, 12, 1, 15, 45))
    assert "15:30:00" in label and "15:45:00" in label


def test_an_alert_window_counts_back_its_lookback_and_stays_open_while_it_fires():
    firing = link_window({"alert_start": "2026-12-01T15:30:05Z", "lookback_s": "240", "metric": "ttft"})
    assert firing[:2] == (dt.datetime(2026, 12, 1, 15, 26, 5), None)
    resolved = link_window({"alert_start": "2026-12-01T15:30:05Z", "lookback_s": "600",
                            "alert_end": "2026-12-01T15:41:00Z"})
    assert resolved[:2] == (dt.datetime(2026, 12, 1, 15, 20, 5), dt.datetime(2026, 12, 1, 15, 41))
    assert "fired 2026-12-01 15:30:05" in resolved[2]


def test_no_window_asked_for():
    assert link_window({}) is None and link_window({"model": "tiny"}) is None


@pytest.mark.parametrize("params, words", [
    ({"since": "yesterday"}, "since='yesterday' is not an ISO 8601 time"),
    ({"alert_start": "2026-12-01T15:30:05Z", "lookback_s": "-5"}, "lookback_s='-5' is not a number of seconds"),
    ({"alert_start": "2026-12-01T15:30:05Z", "lookback_s": "nan"}, "lookback_s='nan'"),
    ({"since": "2026-12-01T15:30:00Z", "until": "2026-12-01T15:00:00Z"}, "ends (2026-12-01 15:00:00) before it starts"),
])
def test_bad_links_say_what_is_wrong(params, words):
    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        link_window(params)
