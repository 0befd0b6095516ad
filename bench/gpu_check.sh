#!/usr/bin/env bash
# Real NVML path on a GPU host (the dev machines have no NVIDIA GPU, so tests use a fake NVML).
#
#   bash bench/gpu_check.sh            # from the repo root; PY=... to pick the interpreter
#
# 1. NVML answers: GPUs, driver, and one raw nvidia-ml-py reading per GPU (units as NVML gives them).
# 2. The backend: one DeviceSample per GPU with every field decoded (W, bytes, MHz, throttle names),
#    compared to the raw readings of step 1.
# 3. End to end: a real collector on free ports, `tailtrace sample --source nvml` for 6 s (with a
#    CUDA matmul load on GPU 0 during the middle 3 s when torch sees CUDA), then SQL on
#    device_samples: rows at 10 Hz per GPU, source='nvml', utilisation rising under load.
# 4. The sampler's CPU cost at 10 Hz on this host (bench/sampler.py --quick --source nvml).
# Exit status 0 only when every check passes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TMP=$(mktemp -d)
COLLECTOR_PID=""
cleanup() {
  if [[ -n "$COLLECTOR_PID" ]]; then kill -TERM "$COLLECTOR_PID" 2>/dev/null || true; wait "$COLLECTOR_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

echo "== 1. NVML"
"$PY" - <<'PYEOF'
import pynvml as n
n.nvmlInit()
print("driver", n.nvmlSystemGetDriverVersion(), "NVML", n.nvmlSystemGetNVMLVersion(), "GPUs", n.nvmlDeviceGetCount())
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    u = n.nvmlDeviceGetUtilizationRates(h); m = n.nvmlDeviceGetMemoryInfo(h)
    print(f"gpu{i} {n.nvmlDeviceGetName(h)} util={u.gpu}% mem_util={u.memory}% used={m.used}B total={m.total}B "
          f"sm={n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)}MHz mem={n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)}MHz "
          f"power={n.nvmlDeviceGetPowerUsage(h)}mW temp={n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)}C "
          f"reasons={n.nvmlDeviceGetCurrentClocksEventReasons(h):#x}")
n.nvmlShutdown()
PYEOF

echo "== 2. backend"
"$PY" - <<'PYEOF'
import pynvml as n
from tailtrace.instrument.device.backends import NvmlBackend
from tailtrace.instrument.device.reasons import throttle_reasons_label
b = NvmlBackend()
samples = b.sample()
n.nvmlInit()
assert len(samples) == n.nvmlDeviceGetCount() >= 1
for s in samples:
    h = n.nvmlDeviceGetHandleByIndex(s.device_index)
    print(s)
    assert s.source == "nvml" and s.device_uuid.startswith(("GPU-", "MIG-"))
    assert s.mem_total_bytes == n.nvmlDeviceGetMemoryInfo(h).total
    assert 0 <= s.util_pct <= 100 and 0 <= s.mem_util_pct <= 100
    assert 100 < s.sm_clock_mhz < 5000 and 100 < s.mem_clock_mhz < 20000
    assert s.power_w is None or 5 < s.power_w < 2000, "power must be watts"
    assert s.temp_c is None or 0 < s.temp_c < 120
    assert s.throttle_reasons == throttle_reasons_label(s.throttle_mask)
b.close()
print("backend OK")
PYEOF

echo "== 3. end to end through the collector"
read -r OTLP_PORT API_PORT < <("$PY" -c "from plumbing.procs import free_port as f; a=f(); b=f()
while b == a: b = f()
print(a, b)")
"$PY" -m tailtrace collect --db "$TMP/gpu.duckdb" --otlp-port "$OTLP_PORT" --api-port "$API_PORT" >"$TMP/collector.log" 2>&1 &
COLLECTOR_PID=$!
"$PY" -c "from plumbing.procs import wait_http; wait_http('http://127.0.0.1:$API_PORT/healthz', 60, what='collector')"
"$PY" -m tailtrace sample --source nvml --interval 0.1 --duration 6 --otlp-endpoint "http://127.0.0.1:$OTLP_PORT" &
SAMPLER_PID=$!
HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [[ "$HAS_CUDA" == 1 ]]; then
  sleep 1.5
  "$PY" - <<'PYEOF'
import time, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float16)
end = time.time() + 3
while time.time() < end:
    a @ a
torch.cuda.synchronize()
print("load done")
PYEOF
fi
wait "$SAMPLER_PID"
sleep 1
"$PY" - "$API_PORT" "$HAS_CUDA" <<'PYEOF'
import json, sys, urllib.request
api, has_cuda = sys.argv[1], sys.argv[2] == "1"
def sql(q):
    req = urllib.request.Request(f"http://127.0.0.1:{api}/api/sql", data=json.dumps({"sql": q}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return json.loads(urllib.request.urlopen(req, timeout=30).read())["rows"]
rows = sql("SELECT device_index, count(*), count(DISTINCT time), max(util_pct), avg(power_w), "
           "string_agg(DISTINCT throttle_reasons, ' | ') FROM device_samples WHERE source = 'nvml' "
           "GROUP BY 1 ORDER BY 1")
for r in rows:
    print("gpu", r[0], "rows", r[1], "distinct times", r[2], "max util", r[3], "avg W", r[4], "reasons", r[5])
assert rows, "no nvml rows in device_samples"
for r in rows:
    assert r[1] == r[2] and r[1] >= 40, "expected ~60 samples per GPU at 10 Hz over 6 s"
if has_cuda:
    assert rows[0][3] >= 50, "GPU 0 utilisation did not rise under the matmul load"
gaps = sql("SELECT median(g) FROM (SELECT epoch_ms(time) - lag(epoch_ms(time)) OVER (ORDER BY time) AS g "
           "FROM device_samples WHERE source = 'nvml' AND device_index = 0)")
print("median gap between samples, ms:", gaps[0][0])
assert 80 <= gaps[0][0] <= 130
print("end to end OK")
PYEOF

echo "== 4. CPU cost at 10 Hz"
"$PY" bench/sampler.py --quick --source nvml
echo "gpu_check: all OK"
