"""tailtrace.plumbing.procs: the ports handed to tests and the demo, and what a server that died says."""

from __future__ import annotations

import socket
import sys

import pytest

from tailtrace.plumbing.errors import UserError
from tailtrace.plumbing.procs import _ephemeral_low, free_port, start_process, stop_process, wait_http


def test_free_ports_lie_below_the_ephemeral_range_and_bind():
    """A port from the kernel's ephemeral range can be taken by vLLM's own bind(0) sockets in the
    minute before the gateway binds it (a CI run lost its demo so): free_port never hands one out."""
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50  # never the same port twice in one process
    assert all(1024 <= p < low for p in ports), (low, sorted(ports)[-3:])
    with socket.socket() as a:
        a.bind(("127.0.0.1", ports[0]))
        a.listen()
    with socket.socket() as s:  # bind(0), as an outgoing socket would, lands in the ephemeral range
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] >= low


@pytest.mark.integration
def test_a_server_that_exits_early_is_named_with_the_end_of_its_log(tmp_path):
    log = tmp_path / "server.log"
    script = "import sys; print('starting'); print('error: port 127.0.0.1:1 is in use'); sys.exit(2)"
    proc = start_process([sys.executable, "-c", script], log)
    try:
        with pytest.raises(UserError) as err:
            wait_http("http://127.0.0.1:9/", 30, proc, what="server", log_path=log)
    finally:
        stop_process(proc, 5)
    msg = str(err.value)
    assert "exited with status 2" in msg
    assert msg.rstrip().endswith("error: port 127.0.0.1:1 is in use"), msg
    assert "starting" in msg
