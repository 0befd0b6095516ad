"""OTLP histogram data points as Prometheus classic-histogram rows: `_bucket` by `le`, `_count`, `_sum`.

Pure functions, no I/O; enrich.metrics_to_batch calls them for every `histogram` and
`exponential_histogram` data point (the one metrics converter of OTLP/HTTP and OTLP/gRPC) and stores
what they return as `metric_points` rows. The rules, and why (docs/schema.md, "metric_points"):

- explicit buckets: one `_bucket` row per bucket, label `le` = its upper bound (OTLP's explicit
  buckets are (bounds[i-1], bounds[i]], upper bound inclusive, as Prometheus' `le`), value the
  CUMULATIVE count; the last is `le="+Inf"`, equal to `_count`.
- exponential buckets (https://opentelemetry.io/docs/specs/otel/metrics/data-model/#exponentialhistogram):
  converted to the same `le` rows, so one reader serves both. Positive bucket `offset+i` holds
  (base**(offset+i), base**(offset+i+1)], base = 2**(2**-scale): its row is le = base**(offset+i+1).
  A row at le = base**offset (the first positive bucket's lower bound) keeps the interpolation of a
  quantile inside its true range. `zero_count` (values in [-zero_threshold, zero_threshold]) is the row
  le = zero_threshold (0 when unset). Negative buckets are kept too, so that the counts still end at
  `_count`: negative bucket `offset+i` holds [-base**(offset+i+1), -base**(offset+i)), its row is
  le = -base**(offset+i) (a value exactly on that bound belongs to the next row: the one place where
  `le` is exclusive, by a single float value); empty ones below the most negative value give no row.
- `_count`, `_sum` (when the point has one), `_min` and `_max` (when it has them).
- refused (the point only, counted in `partial_success`, the rest of the request stored): bucket_counts
  whose length is not len(explicit_bounds) + 1 (both empty is allowed: only `+Inf`), bounds that are
  not finite and strictly increasing, bucket counts that do not add up to `count`, a negative or
  non-finite zero_threshold, more than MAX_BUCKETS buckets.
"""

from __future__ import annotations

import itertools
import math

from prometheus_client.utils import floatToGoString

__all__ = ["MAX_BUCKETS", "BadPoint", "explicit_rows", "exponential_rows", "le_text"]

# Largest number of buckets in one point (an SDK's exponential histogram has 160 per sign by
# default, explicit ones a few dozen): a point would otherwise turn a 16 MiB request into 16 M rows.
MAX_BUCKETS = 4096


class BadPoint(ValueError):
    """A histogram data point that breaks the OTLP data model; the message says how."""


def le_text(bound: float) -> str:
    """The `le` label of an upper bound as Prometheus' Python client writes it ("0.005", "1.0",
    "1e+15", "+Inf"; Prometheus 3 normalizes scraped `le` values to this form too)."""
    return "-" + floatToGoString(-bound) if bound < 0 else floatToGoString(bound)


def _stats(p, count: int, buckets: list[tuple[float, int]]) -> list[tuple[str, str | None, float]]:
    """The rows of one point: `_bucket` rows (strictly increasing finite `le`, cumulative counts;
    `buckets` may repeat or misorder a bound by float rounding: the larger count at the larger bound
    wins), the `+Inf` bucket, then `_count`, `_sum`, `_min`, `_max`."""
    kept: list[list] = []
    for bound, cum in buckets:
        if not math.isfinite(bound):        # past float range: folded into +Inf (or the next row)
            continue
        if kept and bound <= kept[-1][0]:
            kept[-1][1] = cum
        else:
            kept.append([bound, cum])
    rows = [("_bucket", le_text(b), float(c)) for b, c in kept]
    rows.append(("_bucket", "+Inf", float(count)))
    rows.append(("_count", None, float(count)))
    for field in ("sum", "min", "max"):
        if p.HasField(field):
            rows.append(("_" + field, None, getattr(p, field)))
    return rows


def explicit_rows(p) -> list[tuple[str, str | None, float]]:
    """(suffix, le or None, value) rows of a `HistogramDataPoint`. Raises `BadPoint`."""
    counts, bounds = list(p.bucket_counts), list(p.explicit_bounds)
    if len(counts) != (len(bounds) + 1 if counts or bounds else 0):
        raise BadPoint(f"{len(counts)} bucket_counts for {len(bounds)} explicit_bounds (needs {len(bounds) + 1})")
    if len(counts) > MAX_BUCKETS:
        raise BadPoint(f"{len(counts)} buckets, over the limit of {MAX_BUCKETS}")
    if not all(math.isfinite(b) for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise BadPoint("explicit_bounds are not finite and strictly increasing")
    if counts and sum(counts) != p.count:
        raise BadPoint(f"bucket_counts add up to {sum(counts)}, not count {p.count}")
    cum, buckets = 0, []
    for bound, c in zip(bounds, counts):
        cum += c
        buckets.append((bound, cum))
    return _stats(p, p.count, buckets)


def _power(index: int, scale: int) -> float:
    """base**index, base = 2**(2**-scale) (exact for scale <= 0); inf past the float range."""
    try:
        return 2.0 ** math.ldexp(index, -scale)
    except OverflowError:
        return math.inf


def exponential_rows(p) -> list[tuple[str, str | None, float]]:
    """(suffix, le or None, value) rows of an `ExponentialHistogramDataPoint`. Raises `BadPoint`."""
    pos, neg = list(p.positive.bucket_counts), list(p.negative.bucket_counts)
    if len(pos) + len(neg) > MAX_BUCKETS:
        raise BadPoint(f"{len(pos) + len(neg)} buckets, over the limit of {MAX_BUCKETS}")
    zt = p.zero_threshold
    if not (math.isfinite(zt) and zt >= 0):
        raise BadPoint(f"zero_threshold {zt} is not a finite number >= 0")
    total = p.zero_count + sum(pos) + sum(neg)
    if total != p.count:
        raise BadPoint(f"zero_count and bucket counts add up to {total}, not count {p.count}")
    scale, cum, buckets = p.scale, 0, []
    for i in reversed(range(len(neg))):         # most negative first: [-base**(k+1), -base**k)
        cum += neg[i]
        if cum:                                 # none below the first value (SDKs send no range as [0])
            buckets.append((-_power(p.negative.offset + i, scale), cum))
    cum += p.zero_count
    buckets.append((zt, cum))
    if pos:
        buckets.append((_power(p.positive.offset, scale), cum))
    for i, c in enumerate(pos):                 # (base**k, base**(k+1)]
        cum += c
        buckets.append((_power(p.positive.offset + i + 1, scale), cum))
    return _stats(p, p.count, buckets)
