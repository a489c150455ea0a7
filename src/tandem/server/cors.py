"""CORS as llama-server answers it, so browser clients on another origin can call the API.

The allowed origin is reflected (never "*", since credentials are allowed), with
Access-Control-Allow-Credentials: true; a preflight OPTIONS gets 200 with
Access-Control-Allow-Methods "GET, POST, DELETE, OPTIONS" and Access-Control-Allow-Headers "*",
before the API key is checked. --cors-origins narrows who is allowed: a comma-separated list of
origins, where "localhost" stands for any port of localhost, 127.0.0.1 and [::1], and "*" for
everyone (the default). A refused origin gets no CORS headers (the browser then blocks it);
the preflight itself still answers 200, as llama-server's.
"""

from __future__ import annotations

from urllib.parse import urlsplit

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
METHODS = "GET, POST, DELETE, OPTIONS"


def origin_allowed(origin: str, allowed: list[str]) -> bool:
    if "*" in allowed or origin in allowed:
        return True
    if "localhost" in allowed:
        try:
            parts = urlsplit(origin)
            host = parts.hostname
            parts.port  # noqa: B018 (a malformed port raises)
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and host in LOCAL_HOSTS
    return False


class Cors:
    """ASGI middleware: the outermost layer of the app."""

    def __init__(self, app, allowed: list[str]) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        extra: list[tuple[bytes, bytes]] = []
        if origin is not None and origin_allowed(origin, self.allowed):
            # capitalized as llama-server sends them (clients that copy headers into a plain
            # dict look them up that way)
            extra = [(b"Access-Control-Allow-Origin", origin.encode("latin-1")),
                     (b"Access-Control-Allow-Credentials", b"true"), (b"Vary", b"Origin")]
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            if extra:
                extra += [(b"Access-Control-Allow-Methods", METHODS.encode()),
                          (b"Access-Control-Allow-Headers", b"*"),
                          (b"Access-Control-Max-Age", b"600")]
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*extra, (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message):
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)
