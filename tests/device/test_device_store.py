"""Device metrics through the real collector into DuckDB: the sampler's OTLP metrics become
`device_samples` rows (one per sample and device, at the sample's own time), and
`tailtrace collect --scrape dcgm=URL` fills `device_samples` (source='dcgm') and `metric_points`."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import psutil
import pytest
from fake_nvml import FakeGpu, FakeNVML

from tailtrace.collector.testing import start_collector
from tailtrace.instrument.device.sampler import DeviceSampler


def _poll(h, sql, pred, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    rows = None
    while time.monotonic() < deadline:
        rows = h.sql(sql)
        if pred(rows):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"timed out; last rows: {rows}")


@pytest.fixture(scope="module")
def collector(tmp_path_factory, request):
    from device_helpers import serve_text

    text = (Path(__file__).parent / "fixtures" / "dcgm_exporter.txt").read_text()
    srv = serve_text(lambda: (200, text))
    h = start_collector(tmp_path_factory.mktemp("dev") / "dev.duckdb", "--scrape", f"dcgm={srv.url}/metrics",
                        "--scrape-interval", "0.2")
    h.dcgm_url = srv.url
    yield h
    h.stop()
    srv.stop()


def _grid_breaks(times_us: list[int], interval_s: float, slack_us: int = 2000) -> list[tuple]:
    """The pairs (j, l) of sweep times that break what the sampler guarantees (module
    instrument/device/sampler.py): a sweep runs at or after its tick (t0 + k*interval), and the
    next tick it waits for lies after the sweep, so between two consecutive sweeps lies at least
    one tick and t_l - t_j > (l - j - 1) * interval for every j < l. A loaded box may wake a sweep
    late (a short gap after it, a long one before it: no bound on one gap), never put two sweeps
    in one tick or run missed ticks in a burst. `slack_us` covers the stored microseconds and the
    wall clock of the stamps against the monotonic clock of the ticks."""
    step = interval_s * 1e6
    return [(j, l, b - a) for (j, a), (l, b) in itertools.combinations(enumerate(times_us), 2)
            if b - a <= (l - j - 1) * step - slack_us]


def test_cpu_samples_reach_device_samples_at_their_own_times(collector):
    ncpu = psutil.cpu_count(logical=True)
    s = DeviceSampler(0.1, collector.otlp_url, export_interval_s=0.5, source="cpu", host="cpu-host-under-test")
    s.start()
    deadline = time.monotonic() + 30  # at least 12 sweeps (1.2 s when not starved; a loaded box may take longer)
    while s.stats.sweeps < 12 and time.monotonic() < deadline:
        time.sleep(0.1)
    s.stop()
    assert s.stats.exported == s.stats.samples and s.stats.sweeps >= 12
    q = ("SELECT epoch_us(time) AS t, count(*), count(DISTINCT device_index), min(util_pct), max(util_pct), "
         "any_value(mem_total_bytes), any_value(source) FROM device_samples "
         "WHERE host = 'cpu-host-under-test' GROUP BY 1 ORDER BY 1")
    rows = _poll(collector, q, lambda r: len(r) >= s.stats.sweeps)
    assert len(rows) == s.stats.sweeps  # one row per core per sweep, none merged or lost
    for _t, n, distinct, lo, hi, total, src in rows:
        assert n == distinct == ncpu and src == "cpu" and 0 <= lo <= hi <= 100
        assert total == psutil.virtual_memory().total
    # the 100 ms grid, not the 0.5 s export: each sweep at its own time, no two in one tick
    times = [r[0] for r in rows]
    assert not _grid_breaks(times, 0.1), [round((b - a) / 1000, 1) for a, b in itertools.pairwise(times)]
    # the check can fail: a burst (three sweeps within one 100 ms tick's reach) breaks it; a sweep
    # woken 95 ms late followed by one on time (a 5 ms gap) does not
    assert _grid_breaks([0, 100_000, 130_000, 150_000], 0.1) == [(0, 3, 150_000), (1, 3, 50_000)]
    assert not _grid_breaks([0, 195_000, 200_000, 300_000, 400_000], 0.1)


def test_nvml_samples_keep_units_and_throttle_names(collector):
    gpu = FakeGpu(uuid="GPU-fake-0", gpu_util=88, mem_util=41, mem_used=60 * 2**30, power_mw=612_340,
                  temp_c=79, sm_clock=1650, reasons=0x4 | 0x8)
    s = DeviceSampler(0.1, collector.otlp_url, export_interval_s=0.3, nvml=FakeNVML([gpu]), host="fake-gpu-host")
    s.start()
    time.sleep(0.5)
    s.stop()
    rows = _poll(collector, "SELECT device_index, device_uuid, util_pct, mem_util_pct, mem_used_bytes, power_w, "
                 "temp_c, sm_clock_mhz, throttle_reasons, source FROM device_samples "
                 "WHERE host = 'fake-gpu-host'", lambda r: len(r) >= s.stats.samples)
    assert rows[0] == [0, "GPU-fake-0", 88.0, 41.0, 60.0 * 2**30, pytest.approx(612.34), 79.0, 1650.0,
                       "sw_power_cap,hw_slowdown", "nvml"]


def test_collect_scrape_dcgm_fills_device_samples_and_metric_points(collector):
    rows = _poll(collector, "SELECT device_index, util_pct, mem_util_pct, power_w, throttle_reasons, "
                 "mem_total_bytes FROM device_samples WHERE source = 'dcgm' AND host = 'gpu-node-7' "
                 "ORDER BY time DESC, device_index LIMIT 2", lambda r: len(r) == 2)
    assert rows[0][:5] == [0, pytest.approx(73.4012), pytest.approx(91.2744), pytest.approx(698.214),
                           "sw_power_cap,sw_thermal_slowdown"]
    assert rows[0][5] == (76473 + 4096 + 542) * 2**20
    assert rows[1][0] == 1 and rows[1][4] == "gpu_idle"
    mp = _poll(collector, "SELECT name, value, json_extract_string(labels, '$.gpu') FROM metric_points "
               "WHERE name = 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE' ORDER BY time DESC, 3 LIMIT 2",
               lambda r: len(r) == 2)
    assert [r[1] for r in mp] == [pytest.approx(0.21553), 0.0]
    up = _poll(collector, "SELECT value, source FROM metric_points WHERE name = 'up' ORDER BY time DESC LIMIT 1",
               lambda r: len(r) == 1)
    assert up[0] == [1.0, "dcgm"]
