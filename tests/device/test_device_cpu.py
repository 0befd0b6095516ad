"""The CPU fallback (source='cpu'), for real: psutil on this machine."""

from __future__ import annotations

import threading
import time

import psutil

from tailtrace.instrument.device.backends import CpuBackend, open_backend


def test_cpu_rows_one_per_core_with_host_memory():
    b = CpuBackend(host="h")
    time.sleep(0.1)
    rows = b.sample()
    n = psutil.cpu_count(logical=True)
    assert len(rows) == n == b.device_count
    assert [r.device_index for r in rows] == list(range(n))
    assert {r.source for r in rows} == {"cpu"} and rows[0].device_uuid == "cpu0"
    assert len({r.time_unix_nano for r in rows}) == 1
    vm = psutil.virtual_memory()
    for r in rows:
        assert 0.0 <= r.util_pct <= 100.0
        assert r.mem_total_bytes == vm.total
        assert 0 < r.mem_used_bytes < vm.total
        assert r.mem_util_pct is None and r.power_w is None and r.throttle_reasons is None
        assert r.sm_clock_mhz is None or r.sm_clock_mhz > 100  # MHz, not GHz or kHz


def test_cpu_busy_core_shows_up():
    b = open_backend("cpu")
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    try:
        peaks = []
        for _ in range(5):
            time.sleep(0.1)
            peaks.append(max(r.util_pct for r in b.sample()))
    finally:
        stop.set()
        t.join()
    # a spinning thread keeps one core busy: over 5 samples of 100 ms the busiest core is >= 50 %
    assert max(peaks) >= 50.0, peaks
