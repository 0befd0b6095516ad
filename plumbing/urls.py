"""One check for every URL a user gives tailtrace (--target, --upstream, --otlp-endpoint, --api,
--scrape and their environment variables), so a typo is one line and exit 2, never a traceback."""

from __future__ import annotations

from urllib.parse import urlsplit

from tailtrace.plumbing.errors import UserError

__all__ = ["check_http_url"]


def check_http_url(url: str, what: str, example: str = "http://127.0.0.1:8000") -> str:
    """Return `url` unchanged when it is an http(s) URL with a host and a port in 1-65535 (or none).

    `what` names the flag or variable in the message (e.g. "--target"). Raises `UserError` for
    anything else: another scheme, no host, a bad IPv6 literal, a port that is not a number or is
    out of range.
    """
    text = str(url).strip()
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError for 'abc' or 99999
    except ValueError as exc:
        raise UserError(f"{what} {url!r} is not a valid URL ({exc}); e.g. {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{what} {url!r} is not an http(s) URL with a host; e.g. {example}")
    if port == 0:
        raise UserError(f"{what} {url!r}: port 0 is not a server's port; e.g. {example}")
    return text
