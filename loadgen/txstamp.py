"""Kernel transmit timestamps of the last byte a TCP connection wrote (Linux `SO_TIMESTAMPING`).

The load generator's schedule lag ends when a request's last byte was written. A stamp taken
when `write()` returns is late whenever the process is descheduled inside the call: on
loopback the kernel hands the segment to the receiver within the sender's `write()` and may run
the woken receiver before returning (measured: 1-5 ms on the shared 2-core box, while the
receiver's kernel timestamp was within microseconds of the call). The kernel's own transmit
timestamp of the last byte (`SOF_TIMESTAMPING_TX_SOFTWARE`, taken when the segment holding it
goes to the device) does not depend on the sender's scheduling, and it waits for the byte to
leave, so a body stuck behind a full receive window is stamped when it finally goes.

`TxStamps.open(transport_socket)` arms one request's write: it (re)starts the kernel's byte
counter (`SOF_TIMESTAMPING_OPT_ID`) at the connection's current position and drops stale
stamps; `last_byte_realtime_ns(n)` returns the CLOCK_REALTIME ns of the stamp of the request's
n-th byte, or None while it has not been transmitted; `close()` disarms. Stamps arrive on the
socket's error queue, which makes the socket poll as in error while they wait there, so they are
read (or the socket disarmed) as soon as the write is done.
"""

from __future__ import annotations

import socket
import struct
import sys

__all__ = ["TxStamps"]

# <asm-generic/socket.h>, <linux/net_tstamp.h>, <linux/errqueue.h>, <linux/in.h>, <linux/in6.h>
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)  # SO_TIMESTAMPING_OLD = SCM_TIMESTAMPING
_TX_SOFTWARE, _SOFTWARE, _OPT_ID, _OPT_TSONLY = 1 << 1, 1 << 4, 1 << 7, 1 << 11
_FLAGS = _TX_SOFTWARE | _SOFTWARE | _OPT_ID | _OPT_TSONLY
_IP_RECVERR, _IPV6_RECVERR = 11, 25
_SO_EE_ORIGIN_TIMESTAMPING, _SCM_TSTAMP_SND = 4, 0
_EXTENDED_ERR = struct.Struct("IBBBBII")  # ee_errno, ee_origin, ee_type, ee_code, ee_pad, ee_info, ee_data
_TIMESPEC = struct.Struct("qq")
_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000) | socket.MSG_DONTWAIT


class TxStamps:
    """One armed request write on one TCP socket (module docstring). Not thread-safe; one
    request at a time per connection (HTTP/1.1 without pipelining)."""

    __slots__ = ("_last_ns", "_sock")

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._last_ns: int | None = None

    @classmethod
    def open(cls, transport_sock) -> TxStamps | None:
        """Arm `transport_sock` (a transport's `get_extra_info("socket")`): a duplicate of its fd,
        the counter restarted, stale stamps dropped. None where unsupported (not Linux, not TCP,
        the option refused)."""
        if not sys.platform.startswith("linux") or transport_sock is None:
            return None
        try:
            if transport_sock.type != socket.SOCK_STREAM:
                return None
            sock = transport_sock.dup()
        except (OSError, AttributeError, ValueError):
            return None
        try:
            # OPT_ID restarts the counter only when it is switched on: off, then on
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _FLAGS & ~_OPT_ID)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _FLAGS)
        except OSError:
            sock.close()
            return None
        self = cls(sock)
        self._read()
        self._last_ns = None
        return self

    def _read(self) -> list[tuple[int, int]]:
        """Drain the error queue: [(key, realtime ns)] of the send stamps in it."""
        out = []
        while True:
            try:
                _, anc, _, _ = self._sock.recvmsg(0, 512, _ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                return out
            except OSError:
                return out
            ts = key = None
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(raw) >= _TIMESPEC.size:
                    sec, nsec = _TIMESPEC.unpack_from(raw)
                    ts = sec * 1_000_000_000 + nsec
                elif ((level, kind) in ((socket.IPPROTO_IP, _IP_RECVERR), (socket.IPPROTO_IPV6, _IPV6_RECVERR))
                      and len(raw) >= _EXTENDED_ERR.size):
                    _, origin, _, _, _, info, data = _EXTENDED_ERR.unpack_from(raw)
                    if origin == _SO_EE_ORIGIN_TIMESTAMPING and info == _SCM_TSTAMP_SND:
                        key = data
            if ts and key is not None:
                out.append((key, ts))

    def last_byte_realtime_ns(self, n_bytes: int) -> int | None:
        """CLOCK_REALTIME ns at which the kernel transmitted byte `n_bytes` (1-based) counted
        from `open`, i.e. the last byte of a request of that size; None until it has been."""
        if n_bytes <= 0:
            return None
        for key, ts in self._read():
            # the key is the offset of each write's last byte (mod 2^32)
            if (key - (n_bytes - 1)) % (1 << 32) < (1 << 31):
                self._last_ns = ts
        return self._last_ns

    def close(self) -> None:
        """Disarm (no more stamps queue up on the connection) and drop the duplicate fd."""
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, 0)
            self._read()
        except OSError:
            pass
        self._sock.close()
