"""The load generator's timing parts against the real kernel (Linux): the transmit timestamp of
a TCP connection's last written byte, the monotonic timerfd, the latency slice and the timer slack. Sockets on
127.0.0.1 only; nothing here asserts a duration from above (the box is shared)."""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading
import time

import pytest

from tailtrace.loadgen.clock import LatencySlice, MonotonicTimerFd, TimerSlack
from tailtrace.loadgen.txstamp import TxStamps

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux kernel interfaces")


@pytest.fixture
def tcp_pair():
    srv = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(("127.0.0.1", srv.getsockname()[1]))
    peer, _ = srv.accept()
    srv.close()
    yield client, peer
    client.close()
    peer.close()


def _recv_all(sock: socket.socket, n: int) -> None:
    while n > 0:
        n -= len(sock.recv(min(n, 1 << 20)))



def _ready(fd: int, events: int, timeout_s: float) -> bool:
    """Whether `fd` polls with any of `events` within `timeout_s` (poll, not select: the suite's
    process may hold more than FD_SETSIZE = 1024 descriptors by the time this runs)."""
    p = select.poll()
    p.register(fd, events)
    return any(ev & events for _, ev in p.poll(timeout_s * 1000))

def test_tx_stamp_is_the_last_byte_of_this_write(tcp_pair):
    client, peer = tcp_pair
    client.sendall(b"w" * 1000)  # earlier traffic on the connection, before arming
    _recv_all(peer, 1000)
    for size in (1, 700, 5000):
        tx = TxStamps.open(client)
        assert tx is not None
        assert tx.last_byte_realtime_ns(size) is None  # nothing written since arming
        before = time.time_ns()
        client.sendall(b"a" * (size - 1))
        assert tx.last_byte_realtime_ns(size) is None  # its last byte is not out yet
        client.sendall(b"z")
        after = time.time_ns()
        ts = tx.last_byte_realtime_ns(size)
        assert ts is not None and before <= ts <= after
        tx.close()
        _recv_all(peer, size)
    # disarmed: no stamp waits on the connection (it would make the socket poll as in error)
    client.sendall(b"q")
    _recv_all(peer, 1)
    assert not _ready(client.fileno(), select.POLLERR, 0)


def test_tx_stamp_waits_until_the_byte_is_transmitted(tcp_pair):
    """A body larger than the receiver's window and the send buffer: the kernel holds its tail
    until the peer reads, and only then stamps the last byte."""
    client, peer = tcp_pair
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    client.setblocking(False)
    tx = TxStamps.open(client)
    body = b"b" * (16 << 20)
    sent = 0
    try:
        while True:
            sent += client.send(body[sent:])
    except BlockingIOError:
        pass
    assert tx.last_byte_realtime_ns(sent) is None
    released = time.time_ns()
    reader = threading.Thread(target=_recv_all, args=(peer, sent))
    reader.start()
    deadline = time.monotonic() + 60
    ts = None
    while ts is None and time.monotonic() < deadline:
        ts = tx.last_byte_realtime_ns(sent)
        time.sleep(0.001)
    reader.join(60)
    tx.close()
    assert ts is not None and ts >= released


def test_tx_stamps_refuse_what_is_not_tcp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert TxStamps.open(udp) is None
    assert TxStamps.open(None) is None


def test_timerfd_is_not_readable_before_its_instant():
    timer = MonotonicTimerFd.create()
    assert timer is not None
    try:
        target = time.perf_counter() + 0.02
        timer.arm(target)
        assert _ready(timer.fd, select.POLLIN, 10)
        assert time.perf_counter() >= target
        timer.clear()
        assert not _ready(timer.fd, select.POLLIN, 0)  # consumed
        timer.arm(time.perf_counter() + 3600)
        timer.disarm()
        assert not _ready(timer.fd, select.POLLIN, 0.05)
        timer.arm(time.perf_counter() - 1)  # past: at once
        assert _ready(timer.fd, select.POLLIN, 10)
    finally:
        timer.close()


def _sched_runtime_ns() -> int:
    import ctypes

    buf = ctypes.create_string_buffer(56)
    assert ctypes.CDLL(None, use_errno=True).syscall(LatencySlice._SYS[os.uname().machine][1], 0, buf, 56, 0) == 0
    return struct.unpack(LatencySlice._ATTR, buf.raw)[5]


@pytest.mark.skipif(os.uname().machine not in LatencySlice._SYS, reason="syscall numbers known for x86-64, arm64")
def test_latency_slice_nests_and_restores_the_threads_own():
    own = _sched_runtime_ns()
    with LatencySlice(100) as outer:
        if not outer.applied:
            pytest.skip("kernel without custom slices (EEVDF sched_runtime, Linux >= 6.12)")
        assert _sched_runtime_ns() == 100_000
        inner = LatencySlice(100)
        inner.__enter__()
        assert inner.applied and _sched_runtime_ns() == 100_000
    # the outer block ended first: the inner one still holds it
    assert _sched_runtime_ns() == 100_000
    inner.__exit__(None, None, None)
    assert _sched_runtime_ns() == own
    with LatencySlice(0) as off:  # 0: left alone
        assert not off.applied and _sched_runtime_ns() == own


def test_timer_slack_is_set_and_restored():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    own = libc.prctl(TimerSlack._PR_GET, 0, 0, 0, 0)
    with TimerSlack(1000):
        assert libc.prctl(TimerSlack._PR_GET, 0, 0, 0, 0) == 1000
        with TimerSlack(5000):
            assert libc.prctl(TimerSlack._PR_GET, 0, 0, 0, 0) == 5000
        assert libc.prctl(TimerSlack._PR_GET, 0, 0, 0, 0) == 1000
    assert libc.prctl(TimerSlack._PR_GET, 0, 0, 0, 0) == own
