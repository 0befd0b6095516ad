"""The guarded read (`tailtrace sql|explain|dashboard --store`) as a user whose profile has
`readonly=1`, as deploy/fleet's `tailtrace_reader`: such a user may change no setting, so the guard
sends none of those the server fixes and reads the server's own (chdb: the real engine, the session
made read-only by `SET readonly = 1`, after its own row cap)."""

from __future__ import annotations

import pytest

from tailtrace.collector.clickhouse.query import guard_settings, run_readonly, server_settings
from tailtrace.collector.clickhouse.store_url import connect_clickhouse, parse_store_url
from tailtrace.plumbing.errors import UserError


@pytest.fixture
def client(tmp_path):
    c = connect_clickhouse(parse_store_url(f"chdb://{tmp_path / 'ch'}"), create=True)
    try:
        yield c
    finally:
        c.close()


def test_a_writable_session_gets_every_guard(client):
    server = server_settings(client)
    assert all(changeable for _, changeable in server.values()), server
    assert guard_settings(5, 10, server=server) == guard_settings(5, 10)
    out = run_readonly(client, "SELECT number FROM numbers(50)", max_rows=7)
    assert [r[0] for r in out["rows"]] == list(range(7)) and out["truncated"] is True
    with pytest.raises(UserError, match="(?i)readonly"):
        run_readonly(client, "CREATE TABLE t (x Int8) ENGINE = Memory")


def test_a_read_only_user_reads_under_the_servers_own_guard(client):
    client.command("SET max_result_rows = 5, result_overflow_mode = 'break'")
    client.command("SET readonly = 1")
    # what such a user meets without the guard's care (ClickHouse: code 164, READONLY)
    with pytest.raises(Exception, match="Cannot modify 'max_result_rows' setting in readonly mode"):
        client.query("SELECT 1", settings={"max_result_rows": 11})
    server = server_settings(client)
    assert not server["max_result_rows"][1] and server["max_result_rows"][0] == "5", server
    assert guard_settings(5, 10, server=server) == {}, server
    # under the server's cap (5 rows, break): a small answer is whole, a large one is cut and says so
    small = run_readonly(client, "SELECT number FROM numbers(3)", max_rows=100)
    assert [r[0] for r in small["rows"]] == [0, 1, 2] and small["truncated"] is False
    big = run_readonly(client, "SELECT number FROM numbers(1000)", max_rows=100)
    assert len(big["rows"]) >= 5 and big["truncated"] is True, big
    two = run_readonly(client, "SELECT number FROM numbers(1000)", max_rows=2)
    assert len(two["rows"]) == 2 and two["truncated"] is True
    # still read-only, by the server
    with pytest.raises(UserError, match="(?i)readonly"):
        run_readonly(client, "CREATE TABLE t (x Int8) ENGINE = Memory")


def test_a_fixed_join_algorithm_is_named_when_an_asof_join_needs_it(client):
    client.command("SET readonly = 1")
    sql = ("SELECT a.t, b.t FROM (SELECT number AS t FROM numbers(5)) a "
           "ASOF JOIN (SELECT number * 2 AS t FROM numbers(3)) b ON a.t >= b.t")
    with pytest.raises(UserError, match="may not change .*join_algorithm.*changeable_in_readonly") as err:
        run_readonly(client, sql)
    assert "\n" not in str(err.value)



# a random draw in a CTE read twice: one distinct value when the CTE is computed once (as DuckDB computes
# a CTE read several times), two when ClickHouse recomputes it at each reference (without MATERIALIZED,
# or without enable_materialized_cte). A UNION, not two scalar subqueries: ClickHouse computes equal
# scalar subqueries once either way.
_DRAWS = ("WITH r AS MATERIALIZED (SELECT rand64() AS x) "
          "SELECT count() FROM (SELECT x FROM r UNION DISTINCT SELECT x FROM r)")


def test_a_materialized_cte_is_computed_once(client):
    assert run_readonly(client, _DRAWS)["rows"] == [[1]]
    assert run_readonly(client, _DRAWS.replace(" MATERIALIZED", ""))["rows"] == [[2]]   # two draws (equal once in 2**64)


def test_a_server_without_materialized_ctes_reads_the_cte_inlined(client):
    # a release before enable_materialized_cte (ClickHouse 26.3) does not parse the keyword: the read drops it
    server = server_settings(client)
    assert "enable_materialized_cte" in server and server["enable_materialized_cte"][1], server
    client._tailtrace_guard = {k: v for k, v in server.items() if k != "enable_materialized_cte"}
    assert "enable_materialized_cte" not in guard_settings(5, 10, materialized=True, server=client._tailtrace_guard)
    assert run_readonly(client, _DRAWS)["rows"] == [[2]]


def test_a_read_only_user_that_may_not_ask_for_materialized_ctes_still_reads(client):
    client.command("SET readonly = 1")
    server = server_settings(client)
    assert not server["enable_materialized_cte"][1], server
    assert run_readonly(client, _DRAWS)["rows"] == [[2]]   # the keyword ignored by the server, no error
