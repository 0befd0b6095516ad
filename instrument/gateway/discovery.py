"""Upstreams from DNS: every address of one name (`--upstream-dns http://vllm:8000`).

Docker Compose (`--scale vllm=N`) and Kubernetes headless services answer one name with the
address of every replica; the gateway resolves it (A and AAAA records, through the event loop's
`getaddrinfo`, off the loop's thread) and routes over one upstream per address, re-resolving every
`--dns-interval` seconds so that replicas added or removed join or leave the choice
(`UpstreamPool.set_urls`). A failed resolution keeps the upstreams of the last good one.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit, urlunsplit

__all__ = ["resolve_upstreams", "urls_for_addresses"]


def urls_for_addresses(url: str, addresses) -> tuple[str, ...]:
    """`url` with its host replaced by each of `addresses` (IPv4 or IPv6 text), sorted, without
    duplicates; the port is the URL's (80 or 443 when it gives none)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    out = set()
    for a in addresses:
        host = f"[{a}]" if ":" in a else a
        out.add(urlunsplit((parts.scheme, f"{host}:{port}", parts.path, parts.query, "")))
    return tuple(sorted(out))


async def resolve_upstreams(url: str, loop: asyncio.AbstractEventLoop | None = None) -> tuple[str, ...]:
    """One upstream URL per address of `url`'s host name (see `urls_for_addresses`). Raises OSError
    (socket.gaierror) when the name does not resolve."""
    loop = loop or asyncio.get_running_loop()
    parts = urlsplit(url)
    infos = await loop.getaddrinfo(parts.hostname, parts.port or None, type=socket.SOCK_STREAM)
    return urls_for_addresses(url, [info[4][0] for info in infos])
