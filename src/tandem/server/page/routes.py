"""The web page at `/` (llama-server serves one there too): a chat with the model that shows
who proposed each token, shipped in the package (static/), no network needed.

    GET /, /index.html        the page (static/index.html)
    GET /static/NAME          its script, style sheet and icon
    GET /sw.js                a service worker: the page's files from the network, from a cache
                              when the server cannot be reached
    GET /manifest.webmanifest the page as an installable app
    GET /_app/version.json    {"version": ...}: the server's version (the name llama-server's
                              page uses); the page shows it
    GET /favicon.ico          the icon

None of these needs the API key (they hold no data; the page asks for the key and sends it
with its API calls), as llama-server serves its page's files. `--no-ui` turns them all off
(404).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from ... import __version__
from ..schemas import ApiError

STATIC = resources.files("tandem.server.page") / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml",
         ".webmanifest": "application/manifest+json"}
# served without the API key (app.Guard): the page's own files hold nothing private
PUBLIC = ("/", "/index.html", "/sw.js", "/manifest.webmanifest", "/_app/version.json",
          "/favicon.ico")
PUBLIC_PREFIX = "/static/"
# the browser checks each time; the files change only with the package
HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}

router = APIRouter()
_FILES = frozenset(p.name for p in STATIC.iterdir() if p.is_file() and not p.name.startswith("."))


def _file(name: str, media: str | None = None) -> Response:
    # only the page's own files, looked up by name: a requested name never reaches the file
    # system (a name too long for it was a 500, found by the fuzzer)
    if name not in _FILES:
        raise ApiError(404, f"no such file: /static/{name}")
    path = STATIC / name
    suffix = name[name.rfind("."):]
    return Response(path.read_bytes(), media_type=media or TYPES.get(suffix, "text/plain"),
                    headers=HEADERS)


@router.get("/")
@router.get("/index.html")
async def index():
    return _file("index.html")


@router.get("/static/{name}")
async def static(name: str):
    return _file(name)


@router.get("/sw.js")
async def service_worker():
    return _file("sw.js")


@router.get("/manifest.webmanifest")
async def manifest():
    return _file("manifest.webmanifest")


@router.get("/favicon.ico")
async def favicon():
    return _file("icon.svg")


@router.get("/_app/version.json")
async def version():
    return JSONResponse({"version": __version__, "program": "tandem"}, headers=HEADERS)
