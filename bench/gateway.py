"""Gateway overhead: the same open-loop load sent straight to an upstream and through
`tailtrace gateway`, interleaved request by request in one run, beside the limit (a bare proxy),
and the highest proxied rate.

    .venv/bin/python bench/gateway.py            # 100 req/s per path for 30 s per pair, then 10 s max-rate runs
    .venv/bin/python bench/gateway.py --quick    # 10 s and 5 s
    .venv/bin/python bench/gateway.py --quick --no-floor --also TAILTRACE_GATEWAY_GIL_SWITCH_INTERVAL=5
    .venv/bin/python bench/gateway.py --upstream http://127.0.0.1:8000 --model tiny   # a real vLLM

By default the upstream is a minimal OpenAI-compatible stub (raw ASGI on uvicorn, answering at once),
so that what is measured is the gateway and not the engine's noise. The gateway runs as its own
process (`tailtrace gateway`), with tracing on, exporting to the real collector when it is available
(else to a port where nothing listens: spans are built and dropped, as in production with the
collector down). Each proxy in turn (the gateway; a second gateway per `--also KEY=VALUE`
environment; the floor) is paired with the upstream: each scheduled request of the pair goes
alternately direct and through the proxy, so both see the same machine load. The floor is a bare
proxy on the same stack (uvicorn, httptools, uvloop, aiohttp) with nothing of the gateway's: what it
adds is what one Python hop costs on this machine. Latency is client E2E (send -> last byte);
streaming requests also report client TTFT. Added latency = proxy percentile - the percentile of
the direct requests beside it. Goal (issue 6): <= 1 ms added at P50 at 100 req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ----------------------------------------------------------------------------- stub upstream

_COMPLETION = json.dumps({
    "id": "cmpl-stub", "object": "text_completion", "created": 0, "model": "stub",
    "choices": [{"index": 0, "text": " hello" * 16, "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 64, "completion_tokens": 16, "total_tokens": 80},
}).encode()
_CHUNK = b'data: {"id":"cmpl-stub","object":"text_completion","model":"stub","choices":[{"index":0,"text":" hello"}]}\n\n'


async def stub_app(scope, receive, send):
    """A minimal OpenAI-compatible upstream: /health, /v1/models, /v1/completions (16 tokens; SSE
    when the body has "stream": true). Answers at once."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    path = scope["path"]
    if path == "/v1/completions" and b'"stream": true' in body:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(16):
            await send({"type": "http.response.body", "body": _CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        return
    data = _COMPLETION if path == "/v1/completions" else b'{"object":"list","data":[{"id":"stub"}]}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def floor_app(upstream: str):
    """The limit: a bare proxy hop on the same stack (uvicorn + httptools + uvloop, aiohttp's
    pooled client) with nothing of the gateway's: no FastAPI, no tracing, no admission, no checks.
    What it adds over a direct request is what any Python proxy costs on this machine."""
    import aiohttp

    session = None
    drop = {b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"}

    async def app(scope, receive, send):
        nonlocal session
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body, more = b"", True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in drop | {b"host"}]
        async with session.request(scope["method"], upstream + scope["path"], data=body or None, headers=headers) as r:
            await send({"type": "http.response.start", "status": r.status,
                        "headers": [(k, v) for k, v in r.raw_headers if k.lower() not in drop]})
            async for chunk in r.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


# ----------------------------------------------------------------------------- load

def _pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _print_row(label: str, xs: list[float], note: str = "") -> None:
    print(f"{label:40s}{len(xs):6d}{_pct(xs, .5):10.3f}{_pct(xs, .9):10.3f}{_pct(xs, .99):10.3f}"
          f"{statistics.fmean(xs) if xs else float('nan'):10.3f}{note}")


async def _one(client, url, body, stream):
    t0 = time.perf_counter()
    ttft = None
    if stream:
        async with client.stream("POST", url, content=body, headers={"content-type": "application/json"}) as r:
            async for chunk in r.aiter_raw():
                if ttft is None and chunk:
                    ttft = time.perf_counter() - t0
            ok = r.status_code == 200
    else:
        r = await client.post(url, content=body, headers={"content-type": "application/json"})
        ok = r.status_code == 200
    return ok, (time.perf_counter() - t0) * 1e3, (ttft * 1e3 if ttft is not None else None)


async def open_loop(targets: dict, rate, duration_s, model, stream):
    """`rate` req/s per target (name -> base URL) for `duration_s`, the targets interleaved
    request by request (so all see the same machine load); returns per-target results."""
    import httpx

    body = json.dumps({"model": model, "prompt": list(range(3, 67)), "max_tokens": 16, "ignore_eos": True,
                       "stream": stream}).encode()
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    out = {name: [] for name in targets}
    errors = {name: 0 for name in targets}
    async with contextlib.AsyncExitStack() as stack:
        order = []
        for name, base in targets.items():
            c = await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=60))
            order.append((name, c, base + "/v1/completions"))
        for name, c, u in order:  # warm the connections and the servers
            for _ in range(20):
                await _one(c, u, body, stream)
        tasks = []
        interval = 1.0 / (len(order) * rate)
        t_start = time.perf_counter()
        n = int(len(order) * rate * duration_s)

        async def fire(i):
            name, c, u = order[i % len(order)]
            ok, e2e, ttft = await _one(c, u, body, stream)
            if ok:
                out[name].append((e2e, ttft))
            else:
                errors[name] += 1

        for i in range(n):
            delay = t_start + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(fire(i)))
        await asyncio.gather(*tasks)
    return out, errors


async def closed_loop(url, concurrency, duration_s, model):
    """Requests completed per second with `concurrency` clients back to back."""
    import httpx

    body = json.dumps({"model": model, "prompt": list(range(3, 67)), "max_tokens": 16, "ignore_eos": True}).encode()
    done = 0
    stop_at = time.perf_counter() + duration_s
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency), timeout=60) as c:
        async def worker():
            nonlocal done
            while time.perf_counter() < stop_at:
                ok, _, _ = await _one(c, url + "/v1/completions", body, False)
                done += ok

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


# ----------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run (10 s open loop, 5 s max rate)")
    ap.add_argument("--rate", type=float, default=100.0, help="open-loop requests/s per path")
    ap.add_argument("--duration", type=float, default=None, help="open-loop seconds")
    ap.add_argument("--upstream", default=None, help="a real upstream base URL instead of the stub")
    ap.add_argument("--model", default="stub")
    ap.add_argument("--concurrency", type=int, default=32, help="clients in the max-rate run")
    ap.add_argument("--no-trace", action="store_true", help="run the gateway with --otlp-endpoint none "
                    "(shows what tracing costs)")
    ap.add_argument("--no-floor", action="store_true", help="leave out the bare proxy (the limit)")
    ap.add_argument("--also", metavar="KEY=VALUE", action="append", default=[],
                    help="also run a second gateway with this environment variable set, as one more "
                    "proxy paired with the upstream (e.g. TAILTRACE_DIRECT_EXPORT=0, TAILTRACE_GATEWAY_GIL_SWITCH_INTERVAL=5)")
    ap.add_argument("--serve-stub", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--serve-floor", nargs=2, metavar=("PORT", "UPSTREAM"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.serve_stub or args.serve_floor:
        import uvicorn

        app, port = (stub_app, args.serve_stub) if args.serve_stub else (floor_app(args.serve_floor[1]),
                                                                          int(args.serve_floor[0]))
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                    loop="uvloop", http="httptools")
        return 0
    for kv in args.also:
        if "=" not in kv:
            ap.error(f"--also takes KEY=VALUE, not {kv!r}")

    from tailtrace.plumbing.procs import free_port, start_process, stop_process, wait_http

    duration = args.duration or (10.0 if args.quick else 30.0)
    max_rate_s = 5.0 if args.quick else 10.0
    py = sys.executable
    procs = []
    collector = None
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    try:
        upstream = args.upstream
        if upstream is None:
            port = free_port()
            procs.append(start_process([py, __file__, "--serve-stub", str(port)], tmp / "stub.log"))
            upstream = f"http://127.0.0.1:{port}"
            wait_http(upstream + "/health", 30, procs[-1], "stub upstream")
        if args.no_trace:
            otlp = "none"
        else:
            try:
                from tailtrace.collector.testing import start_collector

                collector = start_collector(tmp / "bench.duckdb")
                otlp = collector.otlp_url
            except Exception as exc:  # noqa: BLE001 - the bench still runs without the collector part
                print(f"(no collector: {exc}; spans go to a closed port)")
                otlp = f"http://127.0.0.1:{free_port()}"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        targets = {"direct": upstream}
        gprocs = {}
        for name, extra in [("gateway", None)] + [(f"gateway[{kv}]", kv) for kv in args.also]:
            gport = free_port()
            genv = dict(env, **dict([extra.split("=", 1)])) if extra else env
            procs.append(start_process([py, "-m", "tailtrace", "gateway", "--upstream", upstream, "--port", str(gport),
                                        "--otlp-endpoint", otlp], tmp / f"gateway-{len(procs)}.log", env=genv))
            targets[name] = f"http://127.0.0.1:{gport}"
            gprocs[name] = procs[-1]
            wait_http(targets[name] + "/health", 60, procs[-1], name)
        if not args.no_floor:
            fport = free_port()
            procs.append(start_process([py, __file__, "--serve-floor", str(fport), upstream], tmp / "floor.log"))
            targets["floor"] = f"http://127.0.0.1:{fport}"
            wait_http(targets["floor"] + "/health", 30, procs[-1], "bare proxy")
        gateway = targets["gateway"]
        proxies = [n for n in targets if n != "direct"]

        print(f"upstream {upstream} ({'stub' if args.upstream is None else 'real'}), gateway {gateway}, "
              f"tracing {'off' if args.no_trace else 'on'}, collector {'on' if collector else 'off'}; "
              f"each proxy in turn beside the upstream (direct), {args.rate:g} req/s to each, interleaved, "
              f"{duration:g} s per pair")
        if "floor" in targets:
            print("floor = a bare proxy (uvicorn + aiohttp, no FastAPI, no tracing, no admission): the limit of "
                  "one Python hop on this machine")
        print(f"{'':40s}{'n':>6s}{'P50 ms':>10s}{'P90 ms':>10s}{'P99 ms':>10s}{'mean ms':>10s}")
        import psutil

        rows = {}
        cpu_per_req = {}
        for stream in (False, True):
            kind = "stream" if stream else "json"
            for proxy in proxies:  # one pair at a time: the proxy beside its own direct baseline
                pair = {"direct": upstream, proxy: targets[proxy]}
                gp = gprocs.get(proxy)
                c0 = sum(psutil.Process(gp.pid).cpu_times()[:2]) if gp else 0.0
                out, errors = asyncio.run(open_loop(pair, args.rate, duration, args.model, stream))
                if gp:
                    done = len(out[proxy]) + errors[proxy] + 20  # + warm-up requests
                    cpu_per_req[(proxy, kind)] = (sum(psutil.Process(gp.pid).cpu_times()[:2]) - c0) * 1e3 / done
                for name, key in (("direct", f"direct (beside {proxy})"), (proxy, proxy)):
                    rows[(kind, key)] = e2e = [x[0] for x in out[name]]
                    _print_row(f"{kind} E2E {key}", e2e, f"  errors {errors[name]}" if errors[name] else "")
                    if stream:
                        rows[("ttft", key)] = t = [x[1] for x in out[name] if x[1] is not None]
                        _print_row(f"stream TTFT {key}", t)

        def added(kind, proxy, q):
            return _pct(rows[(kind, proxy)], q) - _pct(rows[(kind, f"direct (beside {proxy})")], q)

        print()
        for kind in ("json", "stream", "ttft"):
            for name in proxies:
                d = rows[(kind, f"direct (beside {name})")]
                print(f"added by {name:26s} ({kind:6s}): P50 {added(kind, name, .5):+.3f} ms   "
                      f"P99 {added(kind, name, .99):+.3f} ms   (P50 ratio to direct "
                      f"{_pct(rows[(kind, name)], .5) / _pct(d, .5):.2f}x)")
        for name in gprocs:
            print(f"{name} CPU per request (user+sys, incl. span export): "
                  + ", ".join(f"{k} {v:.2f} ms" for (n, k), v in cpu_per_req.items() if n == name))
        print(f"[load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs]")
        if "floor" in targets:
            gp, fp = added("json", "gateway", .5), added("json", "floor", .5)
            ratio = f"ratio {gp / fp:.2f}x; " if fp > 0.05 else ""  # a floor near 0 gives no meaningful ratio
            print(f"gateway vs the limit (json, added at P50): {gp:.3f} ms vs {fp:.3f} ms for the bare proxy "
                  f"({ratio}tailtrace's own part {gp - fp:+.3f} ms)")
        direct_rate = asyncio.run(closed_loop(upstream, args.concurrency, max_rate_s, args.model))
        gw_rate = asyncio.run(closed_loop(gateway, args.concurrency, max_rate_s, args.model))
        print(f"\nmax rate, {args.concurrency} clients closed-loop, {max_rate_s:g} s each: direct {direct_rate:.0f} req/s, "
              f"through the gateway {gw_rate:.0f} req/s (ratio {gw_rate / direct_rate:.2f}; 2 cores shared by "
              "client, gateway and upstream)")
        added_p50 = added("json", "gateway", .5)
        print(f"goal <= 1 ms added at P50 at {args.rate:g} req/s (json): {'met' if added_p50 <= 1.0 else 'NOT met'} "
              f"({added_p50:.3f} ms)")
        if collector is not None:
            time.sleep(1.5)
            try:
                n = collector.sql("SELECT count(*) FROM spans WHERE phase = 'gateway'")[0][0]
                print(f"gateway server spans stored by the collector: {n}")
            except Exception as exc:  # noqa: BLE001
                print(f"(collector query failed: {exc})")
    finally:
        for p in reversed(procs):
            stop_process(p)
        if collector is not None:
            collector.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
