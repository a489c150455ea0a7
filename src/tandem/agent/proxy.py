"""llama-server's MCP CORS proxy (--ui-mcp-proxy): GET/POST /cors-proxy?url=URL makes the same
request to URL from the server (httpx), so a page in the browser can reach an MCP server that
sends no CORS headers (the route: tandem/server/experimental.py).

Only the headers the caller names as `x-llama-server-proxy-header-<name>: value` go on, as
`<name>: value`; none of the caller's own (its API key, cookies, Authorization) ever does. The
body goes on as it came. The answer comes back as it arrives (streamed: MCP uses SSE), with its
status and headers, less the hop-by-hop ones and any Access-Control-* (this server sends its
own). Redirects are followed, and the caller's credentials are not carried to another host.
A target that cannot be reached: 500 "proxy error: ...".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx

log = logging.getLogger("tandem.server")

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT = 600  # seconds to connect, and between two reads or writes
MAX_REDIRECTS = 20
REDIRECTS = (301, 302, 303, 307, 308)
# never copied from the target's answer: the connection's own, or CORS (ours applies)
_STRIP = {"server", "transfer-encoding", "content-length", "keep-alive", "connection"}
# never sent on: no compressed answer (it goes back as it comes); the length is the body's own
_UNSENT = {"accept-encoding", "transfer-encoding", "content-length", "host"}
# the caller's credentials for the first host are not carried to another one
_CREDENTIALS = {"authorization", "cookie", "proxy-authorization"}


class ProxyError(Exception):
    """A target the proxy will not or cannot reach, answered with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]


def parse_target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with its query) of an http(s) URL, or llama-server's error."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ProxyError(500, "invalid URL: no scheme")
    if scheme not in ("http", "https"):
        raise ProxyError(500, f"unsupported URL scheme: {scheme}")
    slash = rest.find("/")
    authority, path = (rest[:slash], rest[slash:]) if slash >= 0 else (rest, "/")
    password = ""
    if "@" in authority:
        userinfo, authority = authority.rsplit("@", 1)
        password = userinfo.partition(":")[2]
    host, port = authority, ""
    if host.startswith("["):  # an IPv6 literal keeps its colons
        close = host.find("]")
        if close < 0:
            raise ProxyError(500, f"invalid IPv6 URL authority: {host}")
        port = host[close + 2:] if host[close + 1:close + 2] == ":" else ""
        host = host[1:close]
    elif ":" in host:
        host, port = host.split(":", 1)
    if port and not port.isdigit():
        raise ProxyError(400, f"invalid port in target URL: {port}")
    if not host:
        raise ProxyError(500, "invalid target URL: missing host")
    if password:
        raise ProxyError(500, "authentication in target URL is not supported")
    return scheme, host, int(port) if port else 80 if scheme == "http" else 443, path


def _authority(scheme: str, host: str, port: int) -> str:
    name = f"[{host}]" if ":" in host else host
    return name if port == (80 if scheme == "http" else 443) else f"{name}:{port}"


def proxied_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers the caller named for the target (x-llama-server-proxy-header-NAME)."""
    return {key[len(PREFIX):]: value for key, value in headers.items()
            if key.lower().startswith(PREFIX) and len(key) > len(PREFIX)}


async def forward(method: str, url: str, headers: dict[str, str], body: bytes) -> Answer:
    """Send the request to `url`, following redirects; the answer, its body still to read."""
    scheme, host, port, path = parse_target(url)
    log.info("proxying %s request to %s://%s%s", method, scheme, _authority(scheme, host, port),
             path)
    client = httpx.AsyncClient(timeout=TIMEOUT)
    client.headers.clear()  # only the named headers go on (and Host, Content-Length)
    for _ in range(MAX_REDIRECTS + 1):
        sent = {k: v for k, v in headers.items() if k.lower() not in _UNSENT}
        request = client.build_request(method, f"{scheme}://{_authority(scheme, host, port)}"
                                       f"{path}", headers={**sent, "Accept-Encoding": "identity"},
                                       content=body or None)
        try:
            resp = await client.send(request, stream=True)
        except (httpx.HTTPError, ValueError) as e:
            await client.aclose()
            raise ProxyError(500, f"proxy error: {e}") from None
        location = resp.headers.get("location")
        if resp.status_code not in REDIRECTS or not location:
            kept = {k: v for k, v in resp.headers.items() if k.lower() not in _STRIP
                    and not k.lower().startswith("access-control-")}
            return Answer(resp.status_code, kept, _body(client, resp))
        await resp.aclose()
        here = (scheme, host, port)
        try:
            scheme, host, port, path = parse_target(
                urljoin(f"{scheme}://{_authority(scheme, host, port)}{path}", location))
        except ProxyError:
            await client.aclose()
            raise
        if (scheme, host, port) != here:
            headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIALS}
        if resp.status_code == 303 or (resp.status_code in (301, 302) and method == "POST"):
            method, body = "GET", b""
    await client.aclose()
    raise ProxyError(500, "proxy error: too many redirects")


async def _body(client: httpx.AsyncClient, resp: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx.HTTPError:
        pass  # the target broke off: the answer ends there
    finally:
        await resp.aclose()
        await client.aclose()
