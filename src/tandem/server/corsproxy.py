"""llama-server's MCP CORS proxy (--ui-mcp-proxy): GET/POST /cors-proxy?url=URL makes the same
request to URL from the server, so a page in the browser can reach an MCP server that sends no
CORS headers. Off by default: then both answer 403 feature_disabled.

Only the headers the caller names as `x-llama-server-proxy-header-<name>: value` go on, as
`<name>: value`; none of the caller's own (its API key, cookies, Authorization) ever does. The
body goes on as it came. The answer comes back as it arrives (streamed: MCP uses SSE), with its
status and headers, less the hop-by-hop ones and any Access-Control-* (this server sends its
own). Redirects are followed. A target that cannot be reached: 500 "proxy error: ...".
"""

from __future__ import annotations

import http.client
import logging
from collections.abc import Iterator
from urllib.parse import urljoin

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import StreamingResponse

from .jobs import off_loop, read_body
from .schemas import ApiError, feature_disabled

log = logging.getLogger("tandem.server")

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT = 600  # seconds to connect, and between two reads or writes
MAX_REDIRECTS = 20
# never copied from the target's answer: the connection's own, or CORS (ours applies)
_STRIP = {"server", "transfer-encoding", "content-length", "keep-alive", "connection"}
# the caller's credentials for the first host are not carried to another one
_CREDENTIALS = {"authorization", "cookie", "proxy-authorization"}

router = APIRouter(include_in_schema=False)


def parse_target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with its query) of an http(s) URL, or llama-server's error."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ApiError(500, "invalid URL: no scheme")
    if scheme not in ("http", "https"):
        raise ApiError(500, f"unsupported URL scheme: {scheme}")
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
            raise ApiError(500, f"invalid IPv6 URL authority: {host}")
        port = host[close + 2:] if host[close + 1:close + 2] == ":" else ""
        host = host[1:close]
    elif ":" in host:
        host, port = host.split(":", 1)
    if port and not port.isdigit():
        raise ApiError(400, f"invalid port in target URL: {port}")
    if not host:
        raise ApiError(500, "invalid target URL: missing host")
    if password:
        raise ApiError(500, "authentication in target URL is not supported")
    return scheme, host, int(port) if port else 80 if scheme == "http" else 443, path


def _authority(scheme: str, host: str, port: int) -> str:
    name = f"[{host}]" if ":" in host else host
    return name if port == (80 if scheme == "http" else 443) else f"{name}:{port}"


def _open(method: str, scheme: str, host: str, port: int, path: str, headers: dict[str, str],
          body: bytes) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send the request, following redirects; the connection and the answer, its body
    unread."""
    for _ in range(MAX_REDIRECTS + 1):
        cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = cls(host, port, timeout=TIMEOUT)
        sent = {}
        for key, value in headers.items():
            low = key.lower()
            if low in ("accept-encoding", "transfer-encoding", "content-length"):
                continue  # no compressed answer; the length is the body's own
            sent[key] = _authority(scheme, host, port) if low == "host" else value
        try:
            conn.request(method, path, body=body or None, headers=sent)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException, ValueError) as e:
            conn.close()
            raise ApiError(500, f"proxy error: {e}") from None
        location = resp.getheader("location")
        if resp.status not in (301, 302, 303, 307, 308) or not location:
            return conn, resp
        conn.close()
        here = (scheme, host, port)
        scheme, host, port, path = parse_target(
            urljoin(f"{scheme}://{_authority(scheme, host, port)}{path}", location))
        if (scheme, host, port) != here:
            headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIALS}
        if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
            method, body = "GET", b""
    raise ApiError(500, "proxy error: too many redirects")


def _body(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> Iterator[bytes]:
    try:
        while chunk := resp.read1(65536):
            yield chunk
    except (OSError, http.client.HTTPException):
        pass  # the target broke off: the answer ends there
    finally:
        conn.close()


@router.get("/cors-proxy")
@router.post("/cors-proxy")
async def cors_proxy(http_req: HttpRequest):
    state = http_req.app.state.tandem
    state.ready()
    if not state.settings.ui_mcp_proxy:
        raise feature_disabled()
    body = await read_body(http_req, state)
    scheme, host, port, path = parse_target(http_req.query_params.get("url", ""))
    headers = {key[len(PREFIX):]: value for key, value in http_req.headers.items()
               if key.lower().startswith(PREFIX) and len(key) > len(PREFIX)}
    log.info("proxying %s request to %s://%s%s", http_req.method, scheme,
             _authority(scheme, host, port), path)
    conn, resp = await off_loop(_open, http_req.method, scheme, host, port, path, headers, body)
    # the content type too, as it came (Starlette would add a charset to a media_type)
    answer_headers = {k: v for k, v in resp.getheaders() if k.lower() not in _STRIP
                      and not k.lower().startswith("access-control-")}
    return StreamingResponse(_body(conn, resp), status_code=resp.status,
                             headers=answer_headers)
