"""The ladder's and SJF's known answers (issue 48) on the real vLLM CPU server behind a real
`tailtrace gateway` process: the load, the arms and their numbers, in one place.

    flock /tmp/tt/heavy.lock .venv/bin/python -m tests.gateway.ladder_known [overload sjf hysteresis]

starts the tiny model's vLLM (tests/helpers.py `start_test_vllm`) and a collector, measures the
capacity through the gateway, and prints each answer's numbers as JSON. tests/gateway/test_ladder_vllm.py
runs `overload` on the session's vLLM (the slow tier); docs/gateway.md holds the numbers of all three.

Each arm is a fresh gateway process on the same vLLM; the load is open-loop Poisson (seeded) from
this process, TTFT measured by the client (first streamed token). Capacity: completions per second
of a closed loop of `SLOTS` clients through the gateway (its --max-concurrency `SLOTS`), so the
queue that builds past it is the gateway's, where its prediction looks.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http

SLOTS = 4  # the gateway's --max-concurrency in every arm
CHAT = (16, 8)  # (prompt tokens, max_tokens) of an interactive chat
SUMMARY = (768, 48)  # a long summary: long prompt, longer answer



@dataclass(frozen=True)
class Result:
    """One request as its client saw it: HTTP `status`, `ttft_s` (None unless 200 with a token),
    `kind` ('chat' | 'summary'), `sent_s` (seconds since the load's start)."""

    status: int
    ttft_s: float | None
    kind: str
    sent_s: float


async def _one(s: aiohttp.ClientSession, url: str, model: str, kind: str, shape: tuple[int, int], t0: float) -> Result:
    n_in, n_out = shape
    body = {"model": model, "prompt": [3 + (i % 1900) for i in range(n_in)], "max_tokens": n_out,
            "stream": True, "ignore_eos": True}
    start = time.monotonic()
    ttft = None
    try:
        async with s.post(url + "/v1/completions", json=body, headers={"x-priority": "interactive"}) as r:
            async for line in r.content:
                if ttft is None and r.status == 200 and line.startswith(b"data: {"):
                    ttft = time.monotonic() - start
            return Result(r.status, ttft, kind, start - t0)
    except aiohttp.ClientError:
        return Result(599, None, kind, start - t0)


async def open_loop(url: str, model: str, rate: float, seconds: float, summary_share: float = 0.0,
                    seed: int = 7) -> list[Result]:
    """Poisson arrivals at `rate` requests/s for `seconds`, a `summary_share` of them SUMMARY, the
    rest CHAT (the same seeded sequence for every arm)."""
    rng = random.Random(seed)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=300)) as s:
        t0 = time.monotonic()
        tasks, at = [], 0.0
        while at < seconds:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            kind = "summary" if rng.random() < summary_share else "chat"
            tasks.append(asyncio.create_task(_one(s, url, model, kind, SUMMARY if kind == "summary" else CHAT, t0)))
            at += rng.expovariate(rate)
        return list(await asyncio.gather(*tasks))


async def closed_loop(url: str, model: str, clients: int, seconds: float, shape=CHAT) -> list[Result]:
    """`clients` clients each sending `shape` requests back to back for `seconds`."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        t0 = time.monotonic()
        out: list[Result] = []

        async def client():
            while time.monotonic() - t0 < seconds:
                out.append(await _one(s, url, model, "chat", shape, t0))

        await asyncio.gather(*(client() for _ in range(clients)))
        return out


def quantile(values: list[float], q: float) -> float | None:
    """The `q` quantile of `values` (linear interpolation, numpy's default); None when empty."""
    v = sorted(values)
    if not v:
        return None
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class Gateways:
    """Starts `tailtrace gateway` processes over one upstream, each with `SLOTS` slots and its own
    settings (flag -> value); `stop()` ends them all."""

    def __init__(self, upstream: str, log_dir: Path, otlp: str = "none"):
        self.upstream, self.log_dir, self.otlp, self.procs = upstream, Path(log_dir), otlp, []

    def start(self, *flags: str) -> str:
        port = free_port()
        log = self.log_dir / f"gateway-{port}.log"
        cmd = [sys.executable, "-m", "tailtrace", "gateway", "--port", str(port), "--upstream", self.upstream,
               "--otlp-endpoint", self.otlp, "--max-concurrency", str(SLOTS), *flags]
        proc = start_process(cmd, log)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/gateway/status", 60, proc, what="gateway", log_path=log)
        return url

    def control(self, url: str) -> dict:
        async def go():
            async with aiohttp.ClientSession() as s, s.get(url + "/gateway/status") as r:
                return (await r.json()).get("control") or {}
        return asyncio.run(go())

    def stop(self) -> None:
        while self.procs:
            stop_process(self.procs.pop(), 15)


def capacity(gws: Gateways, model: str) -> dict:
    """Completions/s of CHAT through a plain gateway (closed loop, `SLOTS` x 2 clients for 8 s after
    a 2 s warm-up), the chat TTFT P50 of one client alone, and the TTFT objective: the default
    objective's (semantics/slo.py DEFAULT_SLO, 2 s), which the load at 0.8x meets with room (M/M/4 at
    0.8 already puts the P99 wait near 0.5 s on this engine: a tighter bound makes 0.8x overload)."""
    from tailtrace.semantics.slo import DEFAULT_SLO, parse_slo

    url = gws.start()
    asyncio.run(closed_loop(url, model, 1, 2.0))
    alone = asyncio.run(closed_loop(url, model, 1, 3.0))
    full = asyncio.run(closed_loop(url, model, SLOTS * 2, 8.0))
    gws.stop()
    ok = [r for r in full if r.status == 200]
    p50 = quantile([r.ttft_s for r in alone if r.ttft_s is not None], 0.5)
    slo_s = next(o.limit_ms for o in parse_slo(DEFAULT_SLO) if o.metric == "ttft") / 1000.0
    return {"completions_per_s": len(ok) / 8.0, "alone_ttft_p50_s": p50, "slo_ttft_p99_s": slo_s}


def _served(results: list[Result], kind: str | None = None) -> list[float]:
    return [r.ttft_s for r in results if r.status == 200 and r.ttft_s is not None and kind in (None, r.kind)]


def summary(results: list[Result], slo_s: float, kind: str | None = None) -> dict:
    """Counts by status, served TTFT P50/P90/P99 (s) and goodput: the share of all sent whose TTFT
    met `slo_s`."""
    mine = [r for r in results if kind in (None, r.kind)]
    ttft = _served(results, kind)
    by: dict[int, int] = {}
    for r in mine:
        by[r.status] = by.get(r.status, 0) + 1
    return {"sent": len(mine), "by_status": by, "ttft_p50_s": quantile(ttft, 0.5), "ttft_p90_s": quantile(ttft, 0.9),
            "ttft_p99_s": quantile(ttft, 0.99),
            "goodput_share": sum(1 for t in ttft if t <= slo_s) / len(mine) if mine else None}


def overload(gws: Gateways, model: str, cap: dict, seconds: float = 20.0, load: float = 1.5) -> dict:
    """The demo's shape at `load` x capacity: a gateway with `--slo ttft_p99=S --ladder shed`
    against one with `--slo` alone (the prediction recorded, nothing done)."""
    slo_s, rate = cap["slo_ttft_p99_s"], load * cap["completions_per_s"]
    slo = f"ttft_p99={slo_s:g}s"
    out = {"rate_per_s": rate, "seconds": seconds, "slo": slo}
    for arm, flags in (("without", ("--slo", slo)),
                       ("with", ("--slo", slo, "--ladder", "shed", "--ladder-hold", "5"))):
        url = gws.start(*flags)
        results = asyncio.run(open_loop(url, model, rate, seconds))
        out[arm] = {**summary(results, slo_s), "control": gws.control(url).get("counts")}
        gws.stop()
    return out


def sjf(gws: Gateways, model: str, cap: dict, block_s: float = 10.0, pairs: int = 4, load: float = 0.85,
        summary_share: float = 0.2) -> dict:
    """A mix of short chats and long summaries at `load` x the mix's capacity (a summary's slot
    time taken as SUMMARY's output over CHAT's), FIFO against SJF in `pairs` interleaved block pairs
    (the same seeded arrivals in both blocks of a pair, a new seed per pair; the order within a pair
    alternates), so that the box's drift falls on both arms: per pair the chats' TTFT P50 and P90
    ratio SJF / FIFO, and the summaries' P99 cost."""
    work = (1 - summary_share) * CHAT[1] + summary_share * SUMMARY[1]
    rate = load * cap["completions_per_s"] * CHAT[1] / work
    out: dict = {"rate_per_s": rate, "block_s": block_s, "summary_share": summary_share, "pairs": []}
    for i in range(pairs):
        pair = {}
        for arm in (("fifo", "sjf") if i % 2 == 0 else ("sjf", "fifo")):
            url = gws.start("--queue-order", arm, "--max-wait", "30")
            results = asyncio.run(open_loop(url, model, rate, block_s, summary_share, seed=100 + i))
            pair[arm] = {"chat": summary(results, cap["slo_ttft_p99_s"], "chat"),
                         "summary": summary(results, cap["slo_ttft_p99_s"], "summary")}
            gws.stop()
        pair["chat_p50_ratio"] = pair["sjf"]["chat"]["ttft_p50_s"] / pair["fifo"]["chat"]["ttft_p50_s"]
        pair["chat_p90_ratio"] = pair["sjf"]["chat"]["ttft_p90_s"] / pair["fifo"]["chat"]["ttft_p90_s"]
        pair["summary_p99_ratio"] = pair["sjf"]["summary"]["ttft_p99_s"] / pair["fifo"]["summary"]["ttft_p99_s"]
        out["pairs"].append(pair)
    return out


def hysteresis(gws: Gateways, model: str, cap: dict, seconds: float = 30.0, load: float = 0.8) -> dict:
    """A steady load at `load` x capacity through the full ladder: the level should stay 0 throughout
    (transitions counted by the gateway)."""
    slo = f"ttft_p99={cap['slo_ttft_p99_s']:g}s"
    url = gws.start("--slo", slo, "--ladder", "output:4,shed", "--ladder-hold", "5")
    results = asyncio.run(open_loop(url, model, load * cap["completions_per_s"], seconds))
    control = gws.control(url)
    gws.stop()
    return {"rate_per_s": load * cap["completions_per_s"], "seconds": seconds, "slo": slo,
            **summary(results, cap["slo_ttft_p99_s"]), "level": control.get("level"), "counts": control.get("counts")}


def predicted(gws: Gateways, model: str, cap: dict, seconds: float = 20.0, load: float = 1.5) -> dict:
    """The overload arm with the ladder, traced to the collector (`gws.collector`): the gateway's
    prediction at arrival against the TTFT the gateway measured (its first byte) and the client's,
    over the served requests (the prediction's check)."""
    slo = f"ttft_p99={cap['slo_ttft_p99_s']:g}s"
    gws.otlp = gws.collector.otlp_url
    url = gws.start("--slo", slo, "--ladder", "shed", "--ladder-hold", "5")
    results = asyncio.run(open_loop(url, model, load * cap["completions_per_s"], seconds, seed=11))
    gws.stop()
    time.sleep(3.0)  # the gateway's last spans
    q = ("SELECT count(*), quantile_cont(predicted_ttft_ms, [0.5, 0.9, 0.99]), quantile_cont(outer_ttft_ms, "
         "[0.5, 0.9, 0.99]), quantile_cont(outer_ttft_ms - predicted_ttft_ms, [0.5, 0.9, 0.99]), "
         "quantile_cont(gateway_queue_ms, [0.5, 0.9, 0.99]) FROM requests WHERE ok AND predicted_ttft_ms IS NOT NULL "
         "AND degradation = 'none'")
    row = gws.collector.sql(q)[0]
    return {"served_traced": row[0], "predicted_ms_p50_p90_p99": row[1], "gateway_ttft_ms_p50_p90_p99": row[2],
            "gateway_minus_predicted_ms_p50_p90_p99": row[3], "gateway_queue_ms_p50_p90_p99": row[4],
            "client": summary(results, cap["slo_ttft_p99_s"])}


ANSWERS = {"overload": overload, "sjf": sjf, "hysteresis": hysteresis, "predicted": predicted}


def main(argv: list[str]) -> int:
    """Start a collector and the tiny model's vLLM, run the answers named (default: all), print JSON."""
    import tempfile

    from tailtrace.collector.testing import start_collector
    from tailtrace.embedded.model import build_tiny_model
    from tests.helpers import start_test_vllm

    names = argv or ["overload", "sjf", "hysteresis"]
    tmp = Path(tempfile.mkdtemp(prefix="ladder-known-"))
    coll = start_collector(tmp / "store.duckdb")
    proc = None
    try:
        t0 = time.monotonic()
        proc, url = start_test_vllm(build_tiny_model(tmp / "tiny"), coll.otlp_url, tmp / "vllm.log")
        print(f"vLLM ready in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        gws = Gateways(url, tmp)
        gws.collector = coll
        try:
            cap = capacity(gws, "tiny")
            print(json.dumps({"capacity": cap}), flush=True)
            for name in names:
                t1 = time.monotonic()
                res = ANSWERS[name](gws, "tiny", cap)
                print(json.dumps({name: res, "wall_s": round(time.monotonic() - t1, 1)}, default=str), flush=True)
        finally:
            gws.stop()
    finally:
        if proc is not None:
            stop_process(proc, 20, interrupt_first=True)
        coll.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
