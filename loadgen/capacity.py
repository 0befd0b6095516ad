"""The capacity probe: what one deployment sustains of a trace's mix, measured in under a minute.

`tailtrace demo` runs it before the replay and then offers `--load` times that capacity, so the
first thing a user sees has a tail on a 2-core laptop and on a GPU host alike (issue 21).

The probe sends one wave of `concurrency` requests at once (default 128, vLLM's default batch
cap on its CPU build), each with the trace's mean prompt length and `output_tokens` output tokens
(`ignore_eos`), through the same path as the replay, with its own run id. The output is long
enough that the wave decodes at its full batch with no prefill for 64 steps after its last prompt
is in: 64 + ceil(concurrency x mean_in / 2048) tokens (2,048 prompt tokens a step, the CPU
build's default budget; a GPU's larger budget only adds pure-decode steps). A second wave would
not help: its requests enter one by one as the first wave's finish, so every step of it carries a
prefill chunk (with the Azure trace's 1,155-token prompts, 256 requests of 64 tokens left no step
at a full batch without prefill). The engine's own steps (the store's `engine_steps`, one row per `llm.engine.step`) then
give two rates:

- decode: output tokens per second of the steps that ran at the batch cap (the largest
  `running` seen, the batch full, no prefill in the step): sum(decode_tokens) / sum(wall time
  of those steps), a step's wall time being the time since the step before it ended (so the
  engine's gaps between steps count), or its own `step_ms` when it began more than 1 s after
  the step before it ended (idle time is not the engine's) and for the window's first step;
- prefill: prompt tokens per second of the steps that carried prefill, their wall time less
  what their decode tokens cost at the decode rate.

Capacity, in requests per second of the mix: 1 / (mean_in / prefill_rate + mean_out /
decode_rate): each request costs its prompt's prefill and its output's decode, the engine
working at its batch cap. With prefill free this is the issue's decode_rate / mean_out; on the
tiny model here the prompts' prefill is a fifth of the engine's time at the Azure trace's mean
input of ~1,000 tokens, so leaving it out would offer ~25% more than the engine serves.

The probe measures at min(concurrency, the engine's cap): with a cap above `concurrency` (a
GPU's default of 1,024 sequences) it reports the rate at that batch, a lower bound.

On a host whose prefill is slow the wave is smaller, so that the probe stays inside its time
limit: one request of the mean prompt with one output token goes first, alone (run id
`<run id>-pre`); its prompt tokens over its TTFT (an underestimate of the prefill rate: its way in
counts) size the wave to the requests whose prompts prefill in `PREFILL_SHARE` of the limit, at
least `MIN_WAVE` (`wave_size`). Measured on a 2-core AVX2 host: the Azure trace's 128 x 1,155
prompt tokens prefilled at ~1,850 tok/s, 80 s, and every request of a full wave ran past the 60 s
limit. The decode rate is then the rate at that smaller batch: a lower bound, as above, and the
capacity with it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tailtrace.plumbing.errors import UserError

__all__ = ["Capacity", "capacity_from_steps", "client_decode_rate", "probe_capacity", "probe_trace", "wave_size"]

Query = Callable[[str, Sequence | None], list]

DEFAULT_CONCURRENCY = 128
PURE_DECODE_STEPS = 64
PREFILL_BUDGET_TOKENS = 2048  # vLLM's CPU build's default max_num_batched_tokens (API server)
DEFAULT_TIMEOUT_S = 60.0
# the wave's prompts may take at most this share of the time limit to prefill (module docstring)
PREFILL_SHARE = 0.35
MIN_WAVE = 8
# a step that ran at the cap: its batch within this share of the largest `running` seen
_AT_CAP = 0.9
# a step that started longer than this after the step before it ended followed idle time: its wall
# time is its own step_ms, not the time since the step before it
_MAX_GAP_S = 1.0


@dataclass
class Capacity:
    """What the probe measured. `rps` requests/s of the mix (mean_in prompt and mean_out output
    tokens); `decode_tok_s` output tokens/s at the batch cap `batch_cap` (requests running);
    `prefill_tok_s` prompt tokens/s; `steps_at_cap` and `prefill_steps` the steps each rate
    comes from; `probe_s` the probe's wall time; `run_id` its requests' run id; `failed` its
    requests that failed (a timeout at the probe's limit counts); `client_decode_tok_s` the same
    decode rate as the client saw it (`client_decode_rate`), an independent check;
    `prefill_from` where `prefill_tok_s` comes from: "engine steps", "one request" (the
    pre-request's TTFT, when no step of the wave carried prefill) or None (unknown: prefill
    counted free, the capacity an upper bound)."""

    rps: float
    decode_tok_s: float
    prefill_tok_s: float | None
    batch_cap: int
    mean_in: float
    mean_out: float
    steps_at_cap: int
    prefill_steps: int
    probe_s: float
    run_id: str
    failed: int = 0
    client_decode_tok_s: float | None = None
    prefill_from: str | None = None

    def text(self) -> str:
        """One line for a report: the capacity and where it comes from."""
        if self.prefill_tok_s:
            pre = f", prefill {self.prefill_tok_s:,.0f} tok/s"
            pre += " (one request's TTFT)" if self.prefill_from == "one request" else ""
        else:
            pre = ", prefill not measured (counted free: an upper bound)"
        return (f"capacity ~{self.rps:.2f} req/s of this trace's mix (mean input {self.mean_in:.0f}, output "
                f"{self.mean_out:.0f} tokens): decode {self.decode_tok_s:,.0f} tok/s at batch {self.batch_cap}{pre} "
                f"(probe: {self.probe_s:.0f} s)")

    def to_dict(self) -> dict:
        return asdict(self)


def probe_output_tokens(mean_in: float, concurrency: int = DEFAULT_CONCURRENCY) -> int:
    """Output tokens of each probe request: PURE_DECODE_STEPS after the wave's prefill at
    PREFILL_BUDGET_TOKENS a step (module docstring)."""
    return PURE_DECODE_STEPS + math.ceil(concurrency * max(1.0, mean_in) / PREFILL_BUDGET_TOKENS)


def wave_size(concurrency: int, mean_in: float, prefill_tok_s: float | None, timeout_s: float) -> int:
    """Requests in the probe's wave: `concurrency`, or fewer when their prompts (`mean_in` tokens
    each) would take more than `PREFILL_SHARE` of `timeout_s` (s) to prefill at `prefill_tok_s`
    (prompt tokens/s; None or <= 0: unknown, no change); at least min(concurrency, MIN_WAVE)."""
    if not prefill_tok_s or prefill_tok_s <= 0 or not math.isfinite(prefill_tok_s):
        return concurrency
    fit = math.floor(PREFILL_SHARE * timeout_s * prefill_tok_s / max(1.0, mean_in))
    return max(min(concurrency, MIN_WAVE), min(concurrency, fit))


def _send(trace: Path, target: str, model: str | None, otlp: str, run_id: str, timeout_s: float,
          progress: bool = False):
    """Replay the probe's `trace` (all at once, real time) under `run_id`; its ReplayResult. Raises
    KeyboardInterrupt when Ctrl-C stopped it."""
    from tailtrace.loadgen.replay import ReplayConfig, run_replay

    res = run_replay(ReplayConfig(trace=str(trace), target=target, model=model, speed=1.0, otlp_endpoint=otlp,
                                  run_id=run_id, slo=None, jitter="none", timeout_s=timeout_s, progress=progress))
    if res.interrupted:
        raise KeyboardInterrupt
    return res


def _prefill_estimate(target: str, model: str | None, otlp: str, out_dir: Path, run_id: str, mean_in: float,
                      max_model_len: int | None, timeout_s: float) -> float | None:
    """Prompt tokens/s of one request of `mean_in` prompt tokens and one output token, alone:
    its prompt over its TTFT (send to first token, the client's clock). None when it failed."""
    trace = probe_trace(Path(out_dir) / f"{run_id}.csv", mean_in, 1, 1, max_model_len)
    res = _send(trace, target, model, otlp, run_id, timeout_s)
    r = res.records[0] if res.records else None
    if r is None or r.error or not r.first_token_unix_nano or r.first_token_unix_nano <= r.send_unix_nano:
        return None
    return max(1, round(mean_in)) / ((r.first_token_unix_nano - r.send_unix_nano) / 1e9)


def probe_trace(path: Path, mean_in: float, concurrency: int = DEFAULT_CONCURRENCY,
                output_tokens: int = PURE_DECODE_STEPS, max_model_len: int | None = None) -> Path:
    """Write the probe's trace (Mooncake CSV: every request at offset 0, `round(mean_in)` prompt
    tokens, cut so that prompt + output fit `max_model_len`, and `output_tokens` output tokens)
    and return its path."""
    n_in = max(1, round(mean_in))
    if max_model_len:
        n_in = max(1, min(n_in, max_model_len - output_tokens - 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("timestamp,input_length,output_length\n" + f"0,{n_in},{output_tokens}\n" * concurrency)
    return path


def _steps_sql() -> str:
    # every step of the window with its wall time: the time since the step before it ended (same
    # engine), so the engine's own gaps between steps count; after an idle gap (the step started
    # more than _MAX_GAP_S after the one before it ended) and for the window's first step, its own
    # step_ms. A step's length is no sign of idleness: a 2,048-token prefill step takes over 1 s on
    # a slow CPU host, and such steps were once dropped as "gaps" (no prefill rate at all)
    return f"""
        SELECT service_name, running, batch_size, prefill_tokens, decode_tokens,
               CASE WHEN prev_us IS NULL OR end_us - coalesce(step_ms, 0) * 1e3 - prev_us > {_MAX_GAP_S} * 1e6
                    THEN step_ms / 1e3 ELSE (end_us - prev_us) / 1e6 END AS wall_s
        FROM (SELECT *, epoch_us(time) AS end_us,
                     lag(epoch_us(time)) OVER (PARTITION BY service_name ORDER BY time, step_index) AS prev_us
              FROM engine_steps WHERE time >= make_timestamp(?) AND time <= make_timestamp(?))"""


def capacity_from_steps(query: Query, start_us: int, end_us: int, mean_in: float, mean_out: float,
                        prefill_fallback: float | None = None) -> dict:
    """The decode and prefill rates of the engine steps that ended in [start_us, end_us] (unix
    us), and the capacity in req/s of a mix of mean_in prompt / mean_out output tokens (formula
    in the module docstring). With no step that carried prefill, the prefill rate is
    `prefill_fallback` (prompt tok/s, e.g. `_prefill_estimate`'s) when given. Returns {rps,
    decode_tok_s, prefill_tok_s, prefill_from, batch_cap, steps_at_cap, prefill_steps}. Raises
    UserError when no step ran at the cap without prefill (nothing to
    measure the decode rate on)."""
    rows = query(f"""
        WITH s AS ({_steps_sql()}),
        cap AS (SELECT max(running) AS cap FROM s),
        d AS (SELECT sum(decode_tokens) AS tok, sum(wall_s) AS wall, count(*) AS n FROM s, cap
              WHERE prefill_tokens = 0 AND running >= {_AT_CAP} * cap.cap AND wall_s > 0)
        SELECT cap.cap, d.tok, d.wall, d.n FROM cap, d""", [start_us, end_us])
    cap, tok, wall, n = rows[0] if rows else (None, None, None, 0)
    if not cap or not n or not wall:
        raise UserError("the capacity probe saw no engine step at a full batch (is the plugin on and the engine "
                        "serving? every probe request may have failed)")
    decode = tok / wall
    pre = query(f"""
        WITH s AS ({_steps_sql()})
        SELECT sum(prefill_tokens), sum(greatest(wall_s - decode_tokens / ?, 0)), count(*) FROM s
        WHERE prefill_tokens > 0 AND wall_s > 0""", [start_us, end_us, decode])
    p_tok, p_wall, p_n = pre[0] if pre else (None, None, 0)
    prefill, prefill_from = (p_tok / p_wall, "engine steps") if p_tok and p_wall else (None, None)
    if prefill is None and prefill_fallback and prefill_fallback > 0 and math.isfinite(prefill_fallback):
        prefill, prefill_from = prefill_fallback, "one request"
    per_request_s = mean_out / decode + (mean_in / prefill if prefill else 0.0)
    return {"rps": 1.0 / per_request_s, "decode_tok_s": decode, "prefill_tok_s": prefill,
            "prefill_from": prefill_from, "batch_cap": int(cap),
            "steps_at_cap": int(n), "prefill_steps": int(p_n or 0)}


def client_decode_rate(records, batch: int) -> float | None:
    """Output tokens/s of the first `batch` requests to get their first token, from the client's
    own stamps: `batch` times the median of each one's (output_tokens - 1) / (last token - first
    token). They were admitted together and decoded side by side, so their rates add up to the
    batch's (an independent check of the engine-side decode rate; None without `batch` such
    requests). The median, not the sum: a stream that a starved client read late and all at once
    has a first-to-last span near 0, and its rate alone would swamp a sum (702,331 tok/s once)."""
    done = sorted((r for r in records if not r.error and r.first_token_unix_nano and r.end_unix_nano
                   and (r.output_tokens or 0) > 1), key=lambda r: r.first_token_unix_nano)[:batch]
    if len(done) < batch:
        return None
    rates = [(r.output_tokens - 1) / ((r.end_unix_nano - r.first_token_unix_nano) / 1e9) for r in done
             if r.end_unix_nano > r.first_token_unix_nano]
    return batch * statistics.median(rates) if len(rates) == batch else None


def probe_capacity(target: str, model: str | None, otlp: str, query: Query, mean_in: float, mean_out: float,
                   out_dir: Path, run_id: str, concurrency: int = DEFAULT_CONCURRENCY,
                   output_tokens: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                   max_model_len: int | None = None, settle_s: float = 3.0, progress: bool = False,
                   adapt_wave: bool = True) -> Capacity:
    """Run the probe against `target` (the gateway or vLLM base URL) and measure (module
    docstring). `query(sql, params)` reads the store its spans go to (through `otlp`);
    `mean_in`/`mean_out` are the trace window's mean prompt/output tokens. Requests still running
    at `timeout_s` are cancelled. Raises UserError when the target is down, every probe request
    failed, or the engine's steps never reached the store. `output_tokens` None:
    `probe_output_tokens(mean_in, concurrency)`. `adapt_wave`: first size the wave to the host's
    prefill (`wave_size`, one request ahead of it); False: `concurrency` requests as given."""
    if not (math.isfinite(mean_out) and mean_out > 0):
        raise UserError(f"the trace window's mean output length must be > 0, not {mean_out!r}")
    pre_prefill = None
    if adapt_wave:
        pre_prefill = _prefill_estimate(target, model, otlp, out_dir, f"{run_id}-pre", mean_in, max_model_len,
                                        timeout_s)
        concurrency = wave_size(concurrency, mean_in, pre_prefill, timeout_s)
    if output_tokens is None:
        output_tokens = probe_output_tokens(mean_in, concurrency)
    trace = probe_trace(Path(out_dir) / f"{run_id}.csv", mean_in, concurrency, output_tokens, max_model_len)
    t0_us = time.time_ns() // 1000
    t0 = time.monotonic()
    res = _send(trace, target, model, otlp, run_id, timeout_s, progress)
    probe_s = time.monotonic() - t0
    t1_us = time.time_ns() // 1000
    failed = sum(1 for r in res.records if r.error)
    if failed == len(res.records):
        first = res.records[0]
        raise UserError(f"every capacity probe request failed ({first.error}: {first.error_message}); is the engine "
                        f"behind {target} serving?")
    # the plugin exports steps in batches: wait until the window's step count stops growing
    last, stable_since, deadline = -1, time.monotonic(), time.monotonic() + 30
    while time.monotonic() < deadline:
        n = query("SELECT count(*) FROM engine_steps WHERE time >= make_timestamp(?) AND time <= make_timestamp(?)",
                  [t0_us, t1_us])[0][0]
        if n != last:
            last, stable_since = n, time.monotonic()
        elif n > 0 and time.monotonic() - stable_since >= settle_s:
            break
        time.sleep(0.5)
    if last <= 0:
        raise UserError("the capacity probe's engine steps never reached the store (is vLLM running with "
                        "tailtrace's plugin, exporting to this collector?)")
    got = capacity_from_steps(query, t0_us, t1_us, mean_in, mean_out, prefill_fallback=pre_prefill)
    return Capacity(mean_in=mean_in, mean_out=mean_out, probe_s=probe_s, run_id=run_id, failed=failed,
                    client_decode_tok_s=client_decode_rate(res.records, got["batch_cap"]), **got)
