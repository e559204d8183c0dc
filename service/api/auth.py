"""API keys: `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`) on every route but the open ones,
or a 401."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.admission import refuse
from service.api.errors import error_response
from service.openai.errors import APIError


class APIKeyMiddleware:
    """Answers 401 in OpenAI's shape unless the request carries one of the keys."""

    def __init__(
        self, app: ASGIApp, api_keys: Iterable[str], open_paths: Iterable[str], open_prefixes: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.api_keys = [key.encode() for key in api_keys]
        self.open_paths = frozenset(open_paths)
        self.open_prefixes = tuple(open_prefixes)

    def is_authorized(self, authorization: str, api_key: str = "") -> bool:
        """Whether the bearer token or the `x-api-key` header is one of the keys."""
        scheme, _, token = authorization.partition(" ")
        return (scheme.lower() == "bearer" and self._is_key(token)) or self._is_key(api_key)

    def _is_key(self, token: str) -> bool:
        given = token.strip().encode()
        if not given:
            return False
        # NOTE: every key is compared, so the time taken says nothing about which one matched.
        return any([hmac.compare_digest(given, key) for key in self.api_keys])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        authorization, api_key = headers.get("authorization", ""), headers.get("x-api-key", "")
        if path in self.open_paths or path.startswith(self.open_prefixes):
            # NOTE: an open route answers everyone, and tells only a caller with the key what is for it alone.
            scope.setdefault("state", {})["has_api_key"] = self.is_authorized(authorization, api_key)
            await self.app(scope, receive, send)
            return
        if self.is_authorized(authorization, api_key):
            await self.app(scope, receive, send)
            return
        problem = "No API key provided" if not (authorization + api_key).strip() else "Incorrect API key provided"
        response = error_response(APIError(
            f"{problem}. Send it as `Authorization: Bearer KEY` or `x-api-key: KEY`.", 401, code="invalid_api_key",
        ))
        response.headers["WWW-Authenticate"] = "Bearer"
        await refuse(response, scope, receive, send)
