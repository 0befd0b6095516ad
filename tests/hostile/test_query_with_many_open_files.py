"""An /api/sql query still answers in a process with more than 1,024 descriptors open (a long-running
collector, or a test session): select.select refused a descriptor numbered 1024 or more
('filedescriptor out of range in select()')."""

from __future__ import annotations

import os
import resource

import pytest

from tailtrace.collector.store.duckdb_store import DuckDBStore
from tailtrace.collector.store.isolated import IsolatedQueries


def test_an_isolated_query_answers_past_descriptor_1024(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}: descriptor 1024 cannot be reached")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1030:  # the next pipe the query opens lands past 1024
            held.append(os.open(os.devnull, os.O_RDONLY))
        store = DuckDBStore(tmp_path / "s.duckdb").start()
        try:
            got = IsolatedQueries(store).run("SELECT 40 + 2 AS x", timeout_s=60, max_rows=1)
        finally:
            store.stop()
        assert got.rows == [(42,)], got.rows
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

