"""The client's own decode rate of the capacity probe (loadgen.capacity.client_decode_rate)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tailtrace.loadgen.capacity import client_decode_rate

S = 10**9


def _rec(first_s: float, end_s: float, out: int, error=None):
    return SimpleNamespace(error=error, first_token_unix_nano=int(first_s * S), end_unix_nano=int(end_s * S),
                           output_tokens=out)


def test_the_batch_rate_is_batch_times_the_median_rate_whatever_one_late_read():
    # four requests decoding side by side at 20 tok/s each (64 tokens: 63 in 3.15 s) -> 80 tok/s
    recs = [_rec(1.0 + 0.01 * i, 4.15 + 0.01 * i, 64) for i in range(4)]
    assert client_decode_rate(recs, 4) == pytest.approx(80.0)
    # one stream read late and all at once (its first and last token 1 us apart): a sum of the
    # rates would read 63 million tok/s; the batch's rate stays that of its other streams
    recs[2] = _rec(4.0, 4.000001, 64)
    assert client_decode_rate(recs, 4) == pytest.approx(80.0)
    # the first `batch` to get their first token speak; failures and one-token answers do not count
    extra = [_rec(9.0, 9.5, 64), _rec(0.5, 1.0, 64, error="timeout"), _rec(0.2, 0.3, 1)]
    assert client_decode_rate(recs + extra, 4) == pytest.approx(80.0)
    assert client_decode_rate(recs[:3], 4) is None
