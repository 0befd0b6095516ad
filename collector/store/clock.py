"""Clock offsets between hosts, estimated from the span pairs of each hop (the four-timestamp method).

A hop is an upstream layer calling a downstream one: client -> gateway, gateway -> vLLM, or client ->
vLLM when no gateway is traced. Each request gives the hop four stamps, two on each host's clock:

    t1  the upstream sends the request       (client.request start; gateway.upstream start)
    t2  the downstream receives it           (gateway server span start; llm.request start)
    t3  the downstream's last byte leaves     (gateway.stream end; llm.request end)
    t4  the upstream receives the last byte   (client.request end; gateway.stream end)

With theta the downstream clock minus the upstream one, NTP's on-wire estimate (RFC 5905, section 8;
Mills, "Internet time synchronization: the Network Time Protocol", 1991) is

    offset = ((t2 - t1) + (t3 - t4)) / 2,    delay = (t4 - t1) - (t3 - t2)

exact when the way in and the way out take equally long, off by half their difference otherwise.
As NTP's clock filter does, the sample with the smallest delay (the least queueing, so the most
symmetric) is the best: per minute and host pair the writer keeps that sample
(`clock_offsets`), and the offset a hop applies is the minimum-delay sample's of the pair's last
ten minutes. Only hops between different hosts (resource attribute `host.name`) get one: on one
host the clock is one, and a real asymmetry (a slow uplink, an injected one-way delay) must stay
visible, not be halved into both directions. `network_in_ms` and `network_out_ms` subtract and add
the offset; their sum, `network_ms`, and `unattributed_ms` do not depend on it.
"""

from __future__ import annotations

__all__ = ["OFFSETS_CTE", "RECORD_SAMPLES", "WINDOW_MINUTES", "offsets_cte", "samples_sql"]


#: the minutes of samples an offset is taken from (the newest of the pair's, backwards)
WINDOW_MINUTES = 10

# The hops of the per-trace aggregate `_agg` (collector/store/schema.py), as (up, down, t1..t4) in ns.
_HOPS = """
    SELECT c_host AS up, g_host AS down, c_start AS t1, g_start AS t2, s_end AS t3, c_end AS t4 FROM {agg}
        WHERE g_start IS NOT NULL
    UNION ALL SELECT g_host, r_host, u_start, r_start, r_end, s_end FROM {agg} WHERE g_start IS NOT NULL
    UNION ALL SELECT c_host, r_host, c_start, r_start, r_end, c_end FROM {agg} WHERE g_start IS NULL
"""


def samples_sql(agg: str = "_agg") -> str:
    """The best clock sample per minute and host pair (the rows of `clock_offsets`) over the hops of
    the per-trace aggregate relation `agg`. DuckDB SQL."""
    return f"""SELECT date_trunc('minute', make_timestamp(t1 // 1000)) AS minute, up AS upstream_host,
        down AS downstream_host,
        arg_min(((t2 - t1) + (t3 - t4)) / 2e6, (t4 - t1) - (t3 - t2)) AS offset_ms,
        min((t4 - t1) - (t3 - t2)) / 1e6 AS delay_ms, count(*) AS samples
    FROM ({_HOPS.format(agg=agg)}) WHERE up IS NOT NULL AND down IS NOT NULL AND up <> down
        AND t1 IS NOT NULL AND t2 IS NOT NULL AND t3 IS NOT NULL AND t4 IS NOT NULL
    GROUP BY ALL"""


#: run in the refresh, before `requests` is computed: the best sample per minute and host pair
RECORD_SAMPLES = "INSERT INTO clock_offsets " + samples_sql()

def offsets_cte(samples: str = "clock_offsets") -> str:
    """A CTE `o(upstream_host, downstream_host, theta_ms)`: the offset each host pair applies, from the
    relation `samples` (clock_offsets' columns; a sample given twice changes nothing). DuckDB SQL."""
    return f"""o AS (
    SELECT upstream_host, downstream_host, arg_min(offset_ms, delay_ms) AS theta_ms FROM (
        SELECT *, max(minute) OVER (PARTITION BY upstream_host, downstream_host) AS newest FROM {samples})
    WHERE minute >= newest - INTERVAL {WINDOW_MINUTES} MINUTE GROUP BY ALL
)"""


#: `offsets_cte` over clock_offsets
OFFSETS_CTE = offsets_cte()
