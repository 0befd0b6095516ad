"""The sender of an open-loop replay (loadgen/replay.py's run): the scheduler that writes each request at
its time from a kernel timer, one task per request, and the connection pool (the module docstring of
loadgen/replay.py says how). The response's reading and the client span: loadgen/exchange.py."""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import math
import time

from tailtrace.loadgen.stats import RequestRecord
from tailtrace.semantics.catalog import STATUS_CANCELLED

__all__ = ["Runner"]

from tailtrace.loadgen.exchange import Exchange, reserved_ids
from tailtrace.loadgen.progress import Progress

log = logging.getLogger("tailtrace.loadgen")


def _peak_requests(offsets_s: list[float], window_s: float = 1.0) -> int:
    """The most requests scheduled within any `window_s` (sorted offsets in s)."""
    best = j = 0
    for i, t in enumerate(offsets_s):
        while offsets_s[j] < t - window_s:
            j += 1
        best = max(best, i - j + 1)
    return best


def _gated_payload_class():
    """aiohttp's BytesPayload whose write the scheduler issues itself, at the request's scheduled
    instant, inside its own loop step (no task switch between the instant and the write).

    aiohttp runs the request up to the body write and calls `write_with_length`, which parks the
    payload and waits; parking also arms the connection's kernel transmit timestamps
    (`loadgen.txstamp`). At the request's time the scheduler calls `fire()`: it stamps `send`
    and writes headers and body at once (aiohttp coalesces the buffered headers with the first
    body write; its `write(drain=False)` does not suspend on a plain connection, so it is driven
    to the end in place). `written` is the kernel's transmit timestamp of the request's last
    byte, read right after the write (on loopback the kernel stamps it inside the call) or, for a
    body that did not fit the socket's buffers, by the payload's own task once it went out. Where
    the kernel gives no stamp, `written` is when the transport's buffer was empty (the last byte
    handed to the kernel). A payload not yet parked when fired (its request was not ready in
    time, e.g. waiting for a `--concurrency-cap` slot) writes as soon as it arrives. Built on
    first use: aiohttp is imported lazily."""
    global _GatedPayload
    if _GatedPayload is not None:
        return _GatedPayload
    from aiohttp.payload import BytesPayload

    from tailtrace.loadgen.txstamp import TxStamps

    perf_ns, time_ns = time.perf_counter_ns, time.time_ns

    class GatedPayload(BytesPayload):
        __slots__ = ("_kick", "_n", "_rec", "_state", "_to_wall", "_tx", "_waiter", "_writer", "due", "gone")

        def __init__(self, body: bytes, rec: RequestRecord, to_wall, state: dict, kick):
            """state: shared by a run's payloads; state["tx"] None (kernel stamps not seen
            yet), True (they work), False (not on this path: not armed any more). kick(): the
            scheduler's "write what is due", called when a payload that was due parks late."""
            super().__init__(body, content_type="application/json")
            self._rec, self._to_wall, self._state, self._kick = rec, to_wall, state, kick
            self.due = False   # its time came before it was ready: the writes wait for it
            self.gone = False  # its request ended without writing it
            self._writer = self._waiter = self._tx = None
            self._n = 0

        @property
        def ready(self) -> bool:
            """aiohttp is waiting for the body write: the request can go at once."""
            return self._writer is not None and not self._waiter.done()

        def fire(self) -> None:
            """Write the request now (it must be `ready`); the request's task sees an error."""
            writer, waiter = self._writer, self._waiter
            self._writer = None
            try:
                self._write_now(writer)
            except Exception as exc:  # noqa: BLE001 (handed on: the request's task raises it)
                waiter.set_exception(exc)
                return
            waiter.set_result(None)

        def _write_now(self, writer) -> None:
            rec = self._rec
            rec.send_unix_nano = self._to_wall(perf_ns())
            before = writer.output_size
            coro = writer.write(self._value, drain=False)
            try:
                coro.send(None)
            except StopIteration:
                pass
            else:  # aiohttp suspended (compression or trace hooks, which this session never sets)
                coro.close()
                raise RuntimeError("aiohttp's body write suspended; it cannot be issued from the scheduler")
            self._n = writer.output_size - before  # the request's bytes: headers and body
            transport = writer.transport
            if transport is not None and not transport.get_write_buffer_size():
                if self._tx is None:
                    rec.written_unix_nano = self._to_wall(perf_ns())
                else:
                    self._stamp()

        def _stamp(self) -> bool:
            """Set `written` from the kernel's stamp of the last byte, if it is there yet."""
            ts = self._tx.last_byte_realtime_ns(self._n)
            if ts is None:
                return False
            # the stamp's age on the wall clock, taken off the monotonic clock's now
            self._rec.written_unix_nano = self._to_wall(perf_ns() - (time_ns() - ts))
            self._state["tx"] = True
            return True

        async def write_with_length(self, writer, content_length):
            transport = writer.transport
            if self._state.get("tx") is not False and transport is not None:
                self._tx = TxStamps.open(transport.get_extra_info("socket"))
                if self._tx is None:
                    self._state["tx"] = False
            try:
                self._writer = writer
                self._waiter = asyncio.get_running_loop().create_future()
                if self.due:
                    self._kick()  # late: the writes waited for it; it goes now, then the rest due
                try:
                    await self._waiter
                finally:
                    self._writer = None
                if self._rec.written_unix_nano:
                    return
                if transport is not None and transport.get_write_buffer_size():
                    await _drain_all(transport, writer)  # a body larger than the socket's buffers
                if self._tx is not None:
                    # the last byte is in the kernel; its stamp comes when it is transmitted
                    wait_s = 1.0 if self._state.get("tx") else 0.05
                    deadline = time.perf_counter() + wait_s
                    while not self._stamp() and time.perf_counter() < deadline:
                        await asyncio.sleep(0.001)
                    if self._rec.written_unix_nano:
                        return
                    if not self._state.get("tx"):
                        self._state["tx"] = False  # no stamps on this path: stop arming
                self._rec.written_unix_nano = self._to_wall(perf_ns())
            finally:
                if self._tx is not None:
                    self._tx.close()
                    self._tx = None

    _GatedPayload = GatedPayload
    return GatedPayload


_GatedPayload = None


async def _drain_all(transport, writer) -> None:
    """Wait until `transport` has handed every buffered byte to the kernel: with the write
    buffer's high-water mark at 0 the transport pauses the protocol while anything is buffered
    and resumes it when the buffer is empty, which `writer.drain()` waits for."""
    low, high = transport.get_write_buffer_limits()  # (low, high), as asyncio defines it
    transport.set_write_buffer_limits(high=0, low=0)
    try:
        while transport.get_write_buffer_size() and not transport.is_closing():
            await writer.drain()
            if transport.get_write_buffer_size():  # not paused (e.g. a transport that ignores limits)
                await asyncio.sleep(0.0005)
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Runner(Exchange):
    """One run's event-loop side: the scheduler, the request tasks, the progress display."""

    # bodies built ahead of their time: at most this many, and this many bytes
    AHEAD_REQUESTS, AHEAD_BYTES = 512, 64 << 20
    # no preparation, body building or span work starts within GUARD_S of a write (a request's
    # preparation does when its own time is within URGENT_S: later it would be late itself); the last
    # HARD_SPIN_S before a write is a spin that does not yield to the loop
    GUARD_S, URGENT_S, HARD_SPIN_S = 0.0005, 0.002, 0.0001

    def __init__(self, config, target, run_id, model, builder, plan, shapes, provider, pace):
        from tailtrace.loadgen.clock import WallClock

        self.config, self.url, self.run_id, self.model = config, target + config.path, run_id, model
        self.models_url = target + "/v1/models"
        self.builder, self.plan, self.shapes = builder, plan, shapes
        self.tracer = provider.get_tracer("tailtrace.loadgen")
        self.pace = pace  # told the next write's time on every pass (loadgen.pacing)
        self.ids = reserved_ids(self.tracer)
        self.flags = "03" if self.ids.is_trace_id_random() else "01"  # sampled (+ random trace id)
        self.clock = WallClock()
        self.records: list[RequestRecord] = []
        self.outstanding = 0
        self.sent = 0
        self.sending = False
        self.finished: collections.deque = collections.deque()  # (record, ids) whose span is to be made
        self.done = 0
        self.failed = 0
        self.sem = asyncio.Semaphore(config.concurrency_cap) if config.concurrency_cap else None
        self.payload_cls = _gated_payload_class()
        self._kick = lambda: None
        # shared by the run's payloads (kernel stamps seen or not; False: not asked for)
        self.payload_state: dict = {} if config.tx_timestamps else {"tx": False}

    @property
    def in_flight(self) -> int:
        """Requests written and not yet over (prepared requests waiting for their time are not)."""
        return max(0, self.outstanding - (len(self.records) - self.sent))

    async def _warm(self, session, n: int) -> int:
        """Open `n` pooled connections to the target before the schedule starts (n concurrent
        GET /v1/models, their connections kept alive), so that a burst does not wait for TCP
        connects. Best effort, 5 s at most: returns how many answered."""
        import aiohttp

        async def one() -> bool:
            try:
                async with session.get(self.models_url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    await r.read()
                    return True
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False

        return sum(await asyncio.gather(*(one() for _ in range(n))))

    async def run(self) -> bool:
        """Run the schedule. Per request, in schedule order: its body is built ahead (while the
        loop has nothing due), its task starts up to `prepare_s` before its time, in a gap
        between writes (cap slot, ids, headers, aiohttp's request up to the body write, a pooled
        or new connection), and at its time the kernel timer's callback (or, without one, this
        task) writes it. Returns True when interrupted."""
        import aiohttp

        from tailtrace.loadgen.clock import MonotonicTimerFd, sleep_until

        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
        tasks: set[asyncio.Task] = set()
        progress = Progress(len(self.plan), self, cfg.progress_interval_s) if cfg.progress else None
        interrupted = False
        perf = time.perf_counter
        lead, spin, guard = max(cfg.prepare_s, 0.0), cfg.spin_s, self.GUARD_S
        pace = self.pace
        todo = collections.deque(zip(self.plan, self.shapes))
        built: collections.deque = collections.deque()   # (planned, shape, body), built ahead
        built_bytes = 0
        gates: collections.deque = collections.deque()   # (perf s, payload): prepared, not yet written
        finished = self.finished
        async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                         auto_decompress=False, skip_auto_headers=("User-Agent",)) as session:
            self.session = session
            warm = cfg.warm_connections
            if warm is None:
                warm = min(_peak_requests([p.offset_s for p in self.plan]), 256)
            if warm > 0:
                await self._warm(session, warm)
            # A full collection scans every object the process holds (tens of ms with aiohttp,
            # OTel and numpy loaded): collect now and move the survivors out of the collector's
            # generations, so that the collections during the run scan only what the run created.
            gc.collect()
            gc.freeze()
            start_perf = perf() + cfg.start_delay_s if cfg.start_at_perf_s is None else cfg.start_at_perf_s
            if progress:
                progress.start()
            self.sending = True
            loop = asyncio.get_running_loop()
            hard = self.HARD_SPIN_S
            timer = MonotonicTimerFd.create() if cfg.precise_timer else None

            def fire_due() -> bool:
                # write every request that is due, in schedule order; one that is not ready yet
                # (its preparation or a --concurrency-cap slot took longer) holds the rest back
                # until it parks (which calls kick). False: held back.
                while gates and gates[0][0] <= perf():
                    payload = gates[0][1]
                    if payload.gone:
                        gates.popleft()
                        continue
                    if not payload.ready:
                        payload.due = True
                        return False
                    gates.popleft()
                    payload.fire()
                    self.sent += 1
                return True

            def arm() -> None:
                # for the next write (at once if it is past), unless a late request holds it back
                if timer is not None and gates and not gates[0][1].due:
                    timer.arm(gates[0][0] - hard)

            def kick() -> None:
                if self.sending:
                    fire_due()
                    arm()

            def on_timer() -> None:
                # the kernel timer, armed HARD_SPIN_S before the next write (the thread's timer
                # slack is 1 us while the run lasts, TimerSlack): spin to its instant
                # and write whatever is due, in this callback (no task switch before the write)
                timer.clear()
                if not gates:
                    return
                t0 = gates[0][0]
                if t0 - perf() > 2 * hard:  # early (re-armed for a later write meanwhile)
                    arm()
                    return
                while perf() < t0:
                    pass
                fire_due()
                arm()
                waiting = self._waiting
                if waiting is not None and not waiting.done():  # the scheduler may prepare the next
                    waiting.set_result(None)

            self._kick = kick
            self._waiting = None

            if timer is not None:
                loop.add_reader(timer.fd, on_timer)
            try:
                while todo or built or gates:
                    now = perf()
                    t_fire = gates[0][0] if gates else math.inf
                    if t_fire <= now:
                        # without the kernel timer the writes happen here, in this step: nothing
                        # runs between the instant and them (with it, here only if it was late)
                        if fire_due():
                            continue
                        # held back by a late request (its parking writes it and the rest), or
                        # the timer's callback is about to run
                        await asyncio.sleep(0.0005)
                        continue
                    room = t_fire - guard  # other work may start before this, none after
                    nxt = built[0][0] if built else todo[0][0] if todo else None
                    t_prep = start_perf + nxt.offset_s - lead if nxt is not None else math.inf
                    # the span exporter's thread encodes only in gaps before this (loadgen.pacing)
                    pace.next_write(min(t_fire, t_prep + lead))
                    if now >= t_prep and (now < room or t_prep + lead - now < self.URGENT_S):
                        # prepare the next request: its task runs up to the parked body write
                        if built:
                            p, shape, body = built.popleft()
                            built_bytes -= len(body)
                        else:
                            p, shape = todo.popleft()
                            body = self.builder.body(p.index, shape, p.hash_ids)
                        t = start_perf + p.offset_s
                        rec = RequestRecord(index=p.index, scheduled_unix_nano=self.clock.to_wall_ns(int(t * 1e9)),
                                            priority=p.priority, input_tokens=shape.input_tokens,
                                            trace_input_tokens=shape.trace_input_tokens,
                                            clipped=shape.clipped, max_tokens=shape.output_tokens)
                        self.records.append(rec)
                        payload = self.payload_cls(body, rec, self.clock.to_wall_ns, self.payload_state, kick)
                        gates.append((t, payload))
                        if len(gates) == 1:
                            arm()
                        task = asyncio.create_task(self._request(rec, payload))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        await asyncio.sleep(0)  # let it run (one preparation per loop pass)
                        continue
                    # idle work, while nothing is due within the guard: bodies ahead (a body of a
                    # few thousand tokens takes ~1 ms, so only with 2 guards of room), then the
                    # spans of finished requests
                    while (todo and len(built) < self.AHEAD_REQUESTS and built_bytes < self.AHEAD_BYTES
                           and perf() < min(room, t_prep) - guard):
                        p, shape = todo.popleft()
                        body = self.builder.body(p.index, shape, p.hash_ids)
                        built.append((p, shape, body))
                        built_bytes += len(body)
                    while finished and perf() < min(room, t_prep):
                        self._finish_span(*finished.popleft())
                    if timer is not None:
                        # the timer callback writes; wake for the next preparation, or just after
                        # the next write when a preparation waits for it (or none is left)
                        # (the callback wakes it when it has written)
                        wake = t_prep if now < t_prep < room else t_fire + 0.001
                        self._waiting = waiting = loop.create_future()
                        handle = loop.call_later(max(0.0, wake - perf()), _wake, waiting)
                        try:
                            await waiting
                        finally:
                            handle.cancel()
                            self._waiting = None
                    elif t_prep <= now or t_fire <= t_prep:  # a write comes first (a due preparation waits for it)
                        await sleep_until(t_fire, spin, hard)
                    else:
                        await sleep_until(t_prep, 0.0)
                self.sending = False
                pace.idle()
                while finished:
                    self._finish_span(*finished.popleft())
                while tasks:
                    await asyncio.wait(set(tasks))
            except asyncio.CancelledError:
                interrupted = True
                for task in list(tasks):
                    task.cancel()
                if tasks:
                    await asyncio.wait(set(tasks), timeout=5)
                t = asyncio.current_task()
                if t is not None:
                    t.uncancel()
            finally:
                pace.idle()
                if timer is not None:
                    loop.remove_reader(timer.fd)
                    timer.close()
                self.sending = False
                while finished:
                    self._finish_span(*finished.popleft())
                gc.unfreeze()
                if progress:
                    progress.stop()
        return interrupted

    async def _request(self, rec: RequestRecord, payload) -> None:
        import aiohttp

        perf_ns = time.perf_counter_ns
        to_wall = self.clock.to_wall_ns
        self.outstanding += 1
        acquired = False
        ids = None
        try:
            if self.sem is not None:
                await self.sem.acquire()
                acquired = True
                rec.client_queue_ns = max(0, to_wall(perf_ns()) - rec.scheduled_unix_nano)
            ids = self.ids.reserve()
            rec.trace_id = f"{ids[0]:032x}"
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                       "x-priority": rec.priority,
                       "traceparent": f"00-{ids[0]:032x}-{ids[1]:016x}-{self.flags}"}
            await self._exchange(rec, payload, headers)
        except asyncio.CancelledError:
            rec.error, rec.error_message = STATUS_CANCELLED, "run interrupted"  # its span says so too
            raise
        except TimeoutError:
            rec.error, rec.error_message = "timeout", f"no complete answer within {self.config.timeout_s:g} s"
        except aiohttp.ClientConnectorError as exc:
            rec.error, rec.error_message = "connect", str(exc)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                aiohttp.ClientOSError, ConnectionError) as exc:
            rec.error, rec.error_message = "disconnect", f"{type(exc).__name__}: {exc}"
        except aiohttp.ClientError as exc:
            rec.error, rec.error_message = "client", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug here must cost one request, not the run
            rec.error, rec.error_message = "client", f"{type(exc).__name__}: {exc}"
            log.exception("request %d failed in the client", rec.index)
        finally:
            if not rec.send_unix_nano:  # never written: the writes behind it must not wait for it
                payload.gone = True
                self._kick()
            if acquired:
                self.sem.release()
            if rec.end_unix_nano is None:
                rec.end_unix_nano = to_wall(perf_ns())
            if not rec.send_unix_nano:
                # never sent (e.g. no connection): the span covers its due time to the failure
                rec.send_unix_nano = min(rec.scheduled_unix_nano + rec.client_queue_ns, rec.end_unix_nano)
            self.outstanding -= 1
            self.done += 1
            self.failed += bool(rec.error)
            if ids is not None:
                if self.sending:  # the scheduler makes it when nothing is due (span work delays writes)
                    self.finished.append((rec, ids))
                else:
                    self._finish_span(rec, ids)
