"""Session fixtures shared by every part's tests (the real collector and the real vLLM CPU server,
tiny local model, tailtrace's plugin on, started once per test session) and the test tiers.

Tiers: a test that starts a process (a collector, vLLM, Prometheus, a browser, a `tailtrace`
command, any subprocess) carries the `integration` marker, as does a test inherently long on a 2-core
box (marked by hand, docs/operations.md names them); `make test-unit` runs the others
(`-m "not integration"`, in 2 processes: pytest-xdist), CI runs all. `slow` tests (vLLM, Prometheus, a browser) and tests that use
a fixture of `PROCESS_FIXTURES` are marked `integration` here at collection; any other test that
starts a process fails at once (`_ProcessGuard`: nothing starts) until it is marked. Plain helpers live in tests/helpers.py.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from tailtrace.plumbing.procs import stop_process
from tests.helpers import (
    demo_command,
    kill_marked,
    marked_env,
    marked_processes,
    native_tracing,
    start_test_vllm,
)

# Fixtures that start a process (or reach one a session fixture started): a test using one is an
# integration test. A fixture left out here is caught by `_ProcessGuard` in `make test-unit`.
PROCESS_FIXTURES = frozenset({
    "session_collector", "vllm_server", "vllm_collector", "demo_run", "demo_store", "collector",
    "coll", "twin", "small_disk", "stub", "slow_stub",  # tests/collector, tests/loadgen: a collector or a stub server
    "partial_store", "otlp_demo_store",  # tests/dashboard: stores written through the real collector
})


class UnmarkedProcessStart(RuntimeError):
    """A test not marked `integration` tried to start a process; nothing was started."""


class _ProcessGuard:
    """Refuses every process start (subprocess.Popen, multiprocessing) during the set-up or call of
    a test that is not marked `integration`: the start raises `UnmarkedProcessStart` before anything
    runs (so `make test-unit` stays fast even then), and `pytest_runtest_makereport` fails the test
    even where its code caught the error."""

    current: ClassVar[object] = None                  # the pytest item running now
    started: ClassVar[dict[str, list[str]]] = {}  # nodeid -> what it tried to start

    @classmethod
    def check(cls, what: str) -> None:
        item = cls.current
        if item is not None and item.get_closest_marker("integration") is None:
            cls.started.setdefault(item.nodeid, []).append(what[:160])
            raise UnmarkedProcessStart(f"{item.nodeid} is not marked integration and started {what[:160]!r}")

    @classmethod
    def install(cls) -> None:
        popen_init = subprocess.Popen.__init__
        mp_start = multiprocessing.process.BaseProcess.start
        if getattr(popen_init, "_tailtrace_guard", False):
            return

        def guarded_init(self, args, *a, **kw):
            cls.check(args if isinstance(args, str) else " ".join(map(str, args)))
            popen_init(self, args, *a, **kw)

        def guarded_start(self):
            cls.check(f"multiprocessing {self.name}")
            mp_start(self)

        guarded_init._tailtrace_guard = True
        subprocess.Popen.__init__ = guarded_init
        multiprocessing.process.BaseProcess.start = guarded_start


def pytest_configure(config):
    _ProcessGuard.install()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") or PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _ProcessGuard.current = item
    try:
        yield
    finally:
        _ProcessGuard.current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    # `make test-unit` runs in two processes (pytest-xdist), which send each report as UTF-8: a
    # test's captured output holding a lone surrogate (a log line quoting an unencodable key) would
    # stop the whole worker, so such characters are written as escapes
    rep.sections = [(k, v.encode("utf-8", "backslashreplace").decode("utf-8")) for k, v in rep.sections]
    started = _ProcessGuard.started.get(item.nodeid)
    if call.when in ("setup", "call") and started and not rep.failed:
        rep.outcome = "failed"
        rep.longrepr = (f"{item.nodeid} started a process but is not marked integration "
                        f"(pytest.mark.integration, or a fixture in tests/conftest.py PROCESS_FIXTURES): "
                        f"{started[0]}")


@dataclass
class VllmServer:
    """A running instrumented vLLM server: `.url` base URL, `.model` served name,
    `.otlp_endpoint` where its spans go, `.collector` (handle of the session collector), `.log` its
    log file."""

    url: str
    model: str
    otlp_endpoint: str
    collector: object
    log: Path
    proc: object


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The tiny model, built once per session (offline, deterministic)."""
    from tailtrace.embedded.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def session_collector(tmp_path_factory):
    """The real collector (`tailtrace collect`) on free ports, one per session. A collector that
    fails to import fails the tests that use it (never a skip)."""
    from tailtrace.collector.testing import start_collector

    handle = start_collector(tmp_path_factory.mktemp("store") / "session.duckdb")
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, session_collector, tmp_path_factory):
    """The real vLLM CPU server with the plugin on (decode spans `full`) and vLLM's own tracing on
    as well (both at once: each request's row comes from the plugin, vLLM's `llm_request` span stays
    in `spans`), both exporting to the session collector."""
    otlp = session_collector.otlp_url
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    args, env = native_tracing(otlp)
    proc, url = start_test_vllm(tiny_model_dir, otlp, log, extra_args=args, env=env)
    try:
        yield VllmServer(url=url, model="tiny", otlp_endpoint=otlp, collector=session_collector, log=log, proc=proc)
    finally:
        stop_process(proc, 20, interrupt_first=True)


@pytest.fixture(scope="session")
def vllm_collector(vllm_server):
    """The session collector that `vllm_server` exports to."""
    return vllm_server.collector


@pytest.fixture
def keep_signal_handlers():
    """For tests that call a command in-process which installs SIGINT/SIGTERM handlers
    (`tailtrace demo`, `tailtrace chaos`): give pytest its own back afterwards."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@dataclass
class DemoRun:
    """One short real `tailtrace demo` (collector, vLLM CPU, gateway, device sampler, Azure trace):
    `.db` the DuckDB store it left, `.output` what it printed, `.returncode`, `.leftover` the
    processes of its session still alive after it exited."""

    db: Path
    output: str
    returncode: int
    leftover: list


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> DemoRun:
    """A short real demo (20 s of the Azure conversation trace at real time), run once per session."""
    import signal
    import subprocess
    import uuid

    out = tmp_path_factory.mktemp("demo")
    mark = uuid.uuid4().hex
    # with the SQL API's bearer token set: the demo's report must send it (it got 401 before)
    env = dict(marked_env(mark), TAILTRACE_API_TOKEN=f"demo-{mark}")
    proc = subprocess.Popen(demo_command(out, 20, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    try:
        text, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kill_marked(mark)
    import time

    time.sleep(1)
    return DemoRun(db=out / "tailtrace.duckdb", output=text.decode(errors="replace"), returncode=proc.returncode,
                   leftover=marked_processes(mark))


@pytest.fixture(scope="session")
def demo_store(demo_run) -> Path:
    """The DuckDB store of the session's short real demo run."""
    assert demo_run.returncode == 0, demo_run.output[-3000:]
    return demo_run.db
