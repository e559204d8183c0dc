"""Requests sent by other sites' pages: a browser names the page's origin in `Origin`, and any page may POST
a form or plain text to a server on 127.0.0.1 without asking first. Such a request that writes or costs
compute (every method but GET, HEAD and OPTIONS) gets 403 unless it comes from this server's own pages or
an origin of --allowed-origins; a request without `Origin` (curl, the SDKs) passes."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.admission import refuse
from service.api.errors import error_response
from service.openai.errors import APIError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int | None]


def parse_origin(text: str) -> Origin | None:
    """(scheme, host, port) of an origin as browsers write it (the port filled in from the scheme), or None
    for one that names no host (`null`, from a sandboxed frame or a file)."""
    try:
        parts = urlsplit(text.strip().lower())
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname:
        return None
    return parts.scheme, parts.hostname, port


class OriginMiddleware:
    """Answers 403 in OpenAI's shape to a write from another origin's page than this server's or those allowed."""

    def __init__(self, app: ASGIApp, allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        origins = list(allowed_origins)
        self.is_any_allowed = "*" in origins
        self.allowed = {parsed for parsed in map(parse_origin, origins) if parsed is not None}

    def is_allowed(self, origin: str, scope: Scope, host: str) -> bool:
        """Whether `origin` is this server's own (the request's scheme and Host) or one of those allowed."""
        parsed = parse_origin(origin)
        return parsed is not None and (parsed in self.allowed or parsed == parse_origin(f"{scope['scheme']}://{host}"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS or self.is_any_allowed:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or self.is_allowed(origin, scope, headers.get("host", "")):
            await self.app(scope, receive, send)
            return
        response = error_response(APIError(
            f"This server takes requests that write or run a model from its own web pages only, not from the "
            f"page at {origin!r}; start it with `--allowed-origins {origin}` to let that site's pages in.", 403,
            code="origin_not_allowed",
        ))
        await refuse(response, scope, receive, send)
