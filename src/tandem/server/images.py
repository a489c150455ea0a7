"""Images in requests, as llama-server takes them (with --mmproj): where an image comes from
(an OpenAI `image_url` part's data: URL, raw base64, file:// under --media-path, http(s)), and
a prompt whose text marks each image's place with the media marker (`/completion`'s
{"prompt_string", "multimodal_data"}, or a chat message's image parts) turned into token ids
with the image's positions (media.Prompt: ids and media.Media, which the engine reads).

Gemma 3's image reads as "<start_of_image>", its vectors, "<end_of_image>", as llama.cpp's
mtmd wraps it."""

from __future__ import annotations

import base64
import binascii
import os
import urllib.request

from ..errors import TandemError
from ..media import Media, Prompt, marker, media_ids
from .schemas import ApiError

DOWNLOAD_MAX = 10 * 1024 * 1024  # llama-server's: 10 MB in 10 seconds
DOWNLOAD_SECONDS = 10
NO_VISION = ("image input is not supported - hint: if this is unexpected, you may need to "
             "provide the mmproj")  # llama-server's words


def from_base64(text: str, where: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=False)
    except (binascii.Error, ValueError) as e:
        raise ApiError(400, f"{where}: invalid base64 ({e})") from None
    if not data:
        raise ApiError(400, f"{where}: invalid base64 value")
    return data


def load(url: str, media_path: str | None, where: str) -> bytes:
    """An image's bytes from a URL as llama-server reads them: http(s) downloaded (10 MB, 10 s),
    file:// only under --media-path (a relative path with no '..'), data:image/...;base64,...,
    or raw base64."""
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"{where}: expected a URL (data:, file://, http(s)://) or base64")
    if url.startswith("http"):
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_SECONDS) as r:
                data = r.read(DOWNLOAD_MAX + 1)
        except Exception as e:  # noqa: BLE001 - any failure to fetch is the request's
            raise ApiError(400, f"{where}: failed to download image ({e})") from None
        if len(data) > DOWNLOAD_MAX:
            raise ApiError(400, f"{where}: the image is larger than {DOWNLOAD_MAX} bytes")
        return data
    if url.startswith("file://"):
        if media_path is None:
            raise ApiError(400, f"{where}: file:// URLs are not allowed unless --media-path is "
                                "specified")
        path = url[len("file://"):]
        if not _safe_path(path):
            raise ApiError(400, f"{where}: file path is not allowed: {path}")
        try:
            with open(os.path.join(media_path, path.lstrip("/")), "rb") as f:
                return f.read()
        except OSError:
            raise ApiError(400, f"{where}: file does not exist or cannot be opened: "
                                f"{path}") from None
    if url.startswith("data:"):
        head, sep, body = url.partition(",")
        if not sep or "," in body:
            raise ApiError(400, f"{where}: invalid uri-encoded base64 value")
        if not head.startswith(("data:image/", "data:video/", "data:audio/")):
            raise ApiError(400, f"{where}: invalid uri format: {head[:40]}")
        if not head.endswith("base64"):
            raise ApiError(400, f"{where}: uri must be base64 encoded")
        return from_base64(body, where)
    return from_base64(url, where)


def _safe_path(path: str) -> bool:
    """llama.cpp's fs_validate_filename with subfolders: no '..', no control or reserved
    characters, at most 255 bytes, no leading or trailing space, no trailing dot."""
    if not path or len(path.encode()) > 255 or ".." in path or path == ".":
        return False
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or c in ':*?"<>|\\' or c in "\uff0e\u2215\u2216\ufffd\ufeff"
           for c in path):
        return False
    return not (path[0] == " " or path[-1] in " .")


def prompt(engine, text: str, images: list[bytes], add_special: bool, where: str) -> Prompt:
    """Token ids for text whose media markers stand for `images` (in order): each marker
    becomes the projector's begin text, the image's positions and its end text; the text
    between is tokenized with special tokens read, BOS first when add_special and the model
    adds one. The images are encoded here (the caller runs this off the event loop)."""
    vision = engine.vision
    if vision is None:
        raise ApiError(400, f"{where}: {NO_VISION}")
    pieces = text.split(marker())
    if len(pieces) - 1 != len(images):
        raise ApiError(400, f"{where}: {len(images)} image(s) but {len(pieces) - 1} media "
                            f"marker(s) ({marker()}) in the text; give one marker per image")
    tok = engine.tok
    ids: list[int] = []
    media: list[Media] = []
    for i, piece in enumerate(pieces):
        if i > 0:
            data = images[i - 1]
            try:
                vectors = vision.encode(data)
            except TandemError as e:
                raise ApiError(400, f"{where}: image {i - 1}: {e}") from None
            ids.extend(tok.encode(vision.begin, add_special=False, parse_special=True))
            media.append(Media(len(ids), vectors))
            ids.extend(media_ids(data, vectors.shape[0]))
            piece = vision.end + piece
        if piece:
            ids.extend(tok.encode(piece, add_special=add_special and i == 0,
                                  parse_special=True))
        elif i == 0 and add_special and tok.add_bos and tok.bos_id is not None:
            ids.append(tok.bos_id)
    return Prompt(ids, media)
