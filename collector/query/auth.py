"""The SQL API's bearer token, read in one place by the server and by every client of it
(`tailtrace sql`/`export`, the dashboard, the demo's report)."""

from __future__ import annotations

from tailtrace.semantics import envs

__all__ = ["TOKEN_ENV", "api_token", "bearer_headers"]

TOKEN_ENV = "TAILTRACE_API_TOKEN"


def api_token() -> str | None:
    """The token from $TAILTRACE_API_TOKEN, or None when unset or empty (the API is then open)."""
    return envs.raw(TOKEN_ENV) or None


def bearer_headers() -> dict[str, str]:
    """`{"Authorization": "Bearer <token>"}` when a token is set, else `{}`: what a client sends."""
    tok = api_token()
    return {"Authorization": f"Bearer {tok}"} if tok else {}
