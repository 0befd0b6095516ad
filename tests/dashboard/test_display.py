"""What the dashboard shows a person: readable durations, and no device rows a host cannot measure."""

from __future__ import annotations

import pandas as pd

from tailtrace.dashboard import charts
from tailtrace.semantics.catalog import format_ms, format_share


def test_durations_read_in_the_unit_a_person_would_use():
    assert format_ms(None) == "n/a"
    assert format_ms(3.14159) == "3.1 ms"  # one decimal under 10 ms
    assert format_ms(9.96) == "10 ms" and format_ms(42.46) == "42 ms"  # whole ms under 10 s
    assert format_ms(1234.4) == "1,234 ms" and format_ms(9999.4) == "9,999 ms"
    assert format_ms(9999.6) == "10.0 s" and format_ms(550_095.0) == "550.1 s"  # was "550,095 ms"
    # float noise does not move a half-way digit: two exact paths to one quantile (numpy's and the step
    # histogram's) differ in the last bits, and show one text
    assert format_ms(2.4499999999999997) == format_ms(2.4500000000000006) == format_ms(2.45)
    assert format_ms(24.499999999999996) == format_ms(24.500000000000004) == format_ms(24.5)
    assert format_ms(56303.960000001076 / 1000) == "56 ms" and format_ms(-3.04) == "-3.0 ms"
    assert format_ms(-0.04) == "0.0 ms"  # rounds to zero: no "-0.0 ms"


def test_shares_never_read_minus_zero():
    # explain's phase table showed "-0%" for a phase a hair shorter in the tail than at the median
    assert format_share(-0.004) == "0%" and format_share(0.004) == "0%"
    assert format_share(-0.04) == "-4%" and format_share(0.615) == "62%" and format_share(None) == "n/a"


def _frames(device_cols: dict):
    t = pd.to_datetime(["2026-01-01 00:00:00", "2026-01-01 00:00:10"])
    lat = pd.DataFrame({"bucket": t, "ttft_p99_ms": [1.0, 2.0], "e2e_p99_ms": [3.0, 4.0]})
    eng = pd.DataFrame({"bucket": t, "service_name": ["v", "v"], "running": [1, 2], "waiting": [0, 1],
                        "batch_size": [1, 2], "step_ms": [5.0, 6.0], "step_p99_ms": [7.0, 8.0],
                        "kv_cache_usage": [0.1, 0.2]})
    dev = pd.DataFrame({"bucket": t, "device": ["h:0", "h:0"], "throttled": [0.0, 0.0], **device_cols})
    return lat, eng, dev


def _titles(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_a_cpu_host_gets_no_sm_clock_or_throttle_rows():
    cpu = charts.engine_device(*_frames({"util_pct": [50.0, 60.0], "sm_clock_mhz": [None, None],
                                         "throttle_reasons": [None, None]}))
    assert "Device util (%)" in _titles(cpu)
    assert "SM clock (MHz)" not in _titles(cpu) and "Throttled (share)" not in _titles(cpu)
    gpu = charts.engine_device(*_frames({"util_pct": [50.0, 60.0], "sm_clock_mhz": [1980.0, 1410.0],
                                         "throttle_reasons": [None, "hw_slowdown"]}))
    assert {"Device util (%)", "SM clock (MHz)", "Throttled (share)"} <= set(_titles(gpu))
    # every trace sits on a row that exists
    rows = len([t for t in _titles(gpu) if t])
    assert all((tr.yaxis or "y") in {f"y{i}" if i > 1 else "y" for i in range(1, rows + 1)} for tr in gpu.data)


def test_the_cpu_sampler_s_clock_is_not_drawn_as_an_sm_clock():
    """The CPU sampler (source 'cpu') records its cores' clock in sm_clock_mhz: the page still shows
    no SM clock or throttle row for it, and its memory when sampled."""
    cpu = charts.engine_device(*_frames({"util_pct": [50.0, 60.0], "sm_clock_mhz": [2445.5, 2445.5],
                                         "throttle_reasons": [None, None], "source": ["cpu", "cpu"],
                                         "mem_used_pct": [41.0, 42.5]}))
    assert {"Device util (%)", "Memory used (%)"} <= set(_titles(cpu))
    assert "SM clock (MHz)" not in _titles(cpu) and "Throttled (share)" not in _titles(cpu)
    gpu = charts.engine_device(*_frames({"util_pct": [50.0, 60.0], "sm_clock_mhz": [1980.0, 1410.0],
                                         "throttle_reasons": [None, "hw_slowdown"], "source": ["nvml", "nvml"]}))
    assert {"SM clock (MHz)", "Throttled (share)"} <= set(_titles(gpu)) and "Memory used (%)" not in _titles(gpu)
