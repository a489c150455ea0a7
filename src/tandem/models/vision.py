"""Gemma 3's image side: an mmproj GGUF (projector type 'gemma3') read and run as llama.cpp's
mtmd runs it (tools/mtmd: clip.cpp, models/siglip.cpp, mtmd-image.cpp, mtmd.cpp).

An image becomes `tokens_per_image` embeddings of the text model's width:

1. decode (llama.cpp: stb_image, 3 channels; here Pillow), RGB, EXIF orientation not applied
   (stb_image ignores it);
2. fit it into image_size x image_size keeping its aspect ratio: Pillow's bilinear filter to
   (ceil(w * s), ceil(h * s)) with s = min(S / w, S / h) in float32, centred on a black canvas
   (llama.cpp's fixed-size preprocessor with its default PAD_CEIL; Gemma 3 only changes the
   filter from bicubic to bilinear; Hugging Face's processor stretches to the square instead);
3. x / 255, then (x - image_mean) / image_std per channel;
4. SigLIP: a conv of stride patch_size (the patch embedding), + learned position embeddings,
   block_count pre-norm layers (LayerNorm -> bidirectional attention -> residual; LayerNorm ->
   fc1 -> GELU (tanh form) -> fc2 -> residual), a final LayerNorm;
5. Gemma 3's projector: the (side x side) patch grid average-pooled by n_merge, an RMS norm times
   mm.soft_emb_norm.weight (the converter stores Gemma's 1 + w, so it is a plain product here),
   then x @ mm.input_projection.weight, stored (vision width, text width) as Hugging Face holds it.

In the prompt the image is `<start_of_image>` + its embeddings + `<end_of_image>`; llama.cpp
decodes the embeddings (one position each, not scaled by sqrt(dim) as token embeddings are)
with non-causal attention among them (mtmd_decode_use_non_causal).
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ModelFileError, TandemError
from .gguf_file import GGUFFile, release_pages
from .quant import dequantize

PROJECTOR = "gemma3"
BEGIN, END = "<start_of_image>", "<end_of_image>"
DEFAULT_MERGE = 4  # llama.cpp's n_merge for every Gemma 3 size; the key only overrides it


class ImageDecodeError(TandemError, ValueError):
    """Bytes that are not an image Pillow can read (a client error: HTTP 400)."""


@dataclass(frozen=True, slots=True)
class VisionParams:
    image_size: int
    patch_size: int
    dim: int
    ffn_dim: int
    n_layers: int
    n_heads: int
    eps: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    n_merge: int
    act: str  # "gelu" (tanh form) | "silu" | "gelu_quick", as clip.use_gelu / clip.use_silu say

    @property
    def side(self) -> int:
        """Patches per side of the image."""
        return self.image_size // self.patch_size


def _params(g: GGUFFile) -> VisionParams:
    where, md = str(g.path), g.metadata

    def num(key: str, kind: type = int, default=None, lo: float = 1, hi: float = 1 << 16):
        value = md.get(key, default)
        if value is None:
            raise ModelFileError(f"{where}: missing GGUF metadata {key!r}")
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (
            kind is float or float(value).is_integer())
        if not ok or not (lo <= value <= hi and math.isfinite(value)):
            what = "an integer" if kind is int else "a number"
            raise ModelFileError(f"{where}: {key} is {value!r}; expected {what} from {lo} to {hi}")
        return kind(value)

    def triple(key: str, positive: bool) -> tuple[float, float, float]:
        v = md.get(key)
        if v is None:
            raise ModelFileError(f"{where}: missing GGUF metadata {key!r}")
        if not (isinstance(v, list) and len(v) >= 3 and all(
                isinstance(x, (int, float)) and math.isfinite(x) and (x > 0 or not positive)
                for x in v[:3])):
            raise ModelFileError(f"{where}: {key} is {v!r}; expected 3 {'positive ' * positive}"
                                 "numbers (red, green, blue)")
        return float(v[0]), float(v[1]), float(v[2])

    p = VisionParams(
        image_size=num("clip.vision.image_size"), patch_size=num("clip.vision.patch_size"),
        dim=num("clip.vision.embedding_length"), ffn_dim=num("clip.vision.feed_forward_length",
                                                             hi=1 << 20),
        n_layers=num("clip.vision.block_count", hi=1024),
        n_heads=num("clip.vision.attention.head_count", hi=1024),
        eps=num("clip.vision.attention.layer_norm_epsilon", float, lo=0, hi=1),
        mean=triple("clip.vision.image_mean", False), std=triple("clip.vision.image_std", True),
        n_merge=num("clip.vision.projector.scale_factor", default=DEFAULT_MERGE, hi=1 << 10),
        act="gelu" if md.get("clip.use_gelu") else "silu" if md.get("clip.use_silu")
        else "gelu_quick",
    )
    if p.image_size % p.patch_size:
        raise ModelFileError(f"{where}: clip.vision.image_size ({p.image_size}) is not a multiple "
                             f"of clip.vision.patch_size ({p.patch_size})")
    if p.side % p.n_merge:
        raise ModelFileError(
            f"{where}: the {p.side} x {p.side} patch grid (clip.vision.image_size / patch_size) "
            f"cannot be pooled by clip.vision.projector.scale_factor {p.n_merge}")
    if p.dim % p.n_heads:
        raise ModelFileError(f"{where}: clip.vision.embedding_length ({p.dim}) is not a multiple "
                             f"of clip.vision.attention.head_count ({p.n_heads})")
    kv = md.get("clip.vision.attention.head_count_kv", p.n_heads)
    if kv != p.n_heads:
        raise ModelFileError(f"{where}: clip.vision.attention.head_count_kv is {kv!r}; SigLIP "
                             f"has as many key/value heads as heads ({p.n_heads})")
    return p


def _expected(p: VisionParams) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's shape (PyTorch order: the file's ne reversed) and why; '?' marks a bias
    (optional, as in llama.cpp). The input projection's width (the text model's) is free."""
    d, f = p.dim, p.ffn_dim
    dim, ffn = f"embedding_length {d}", f"feed_forward_length {f}"
    out = {
        "v.patch_embd.weight": ((d, 3, p.patch_size, p.patch_size),
                                f"{dim} x 3 channels x patch_size {p.patch_size} squared"),
        "v.patch_embd.bias?": ((d,), dim),
        "v.position_embd.weight": ((p.side * p.side, d), f"{p.side} x {p.side} patches x {dim}"),
        "v.post_ln.weight": ((d,), dim), "v.post_ln.bias?": ((d,), dim),
        "mm.soft_emb_norm.weight": ((d,), dim),
    }
    for i in range(p.n_layers):
        b = f"v.blk.{i}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[b + t + ".weight"] = ((d, d), f"{dim} x {dim}")
            out[b + t + ".bias?"] = ((d,), dim)
        for t in ("ln1", "ln2"):
            out[b + t + ".weight"] = ((d,), dim)
            out[b + t + ".bias?"] = ((d,), dim)
        out[b + "ffn_up.weight"] = ((f, d), f"{ffn} rows x {dim} columns")
        out[b + "ffn_up.bias?"] = ((f,), ffn)
        out[b + "ffn_down.weight"] = ((d, f), f"{dim} rows x {ffn} columns")
        out[b + "ffn_down.bias?"] = ((d,), dim)
    return out


def mmproj_memory(path: str | os.PathLike) -> tuple[int, int]:
    """(weights, working) bytes a loaded mmproj holds, read without loading: every tensor in
    float32, and one image's activations (every patch's residual, attention and MLP rows)."""
    g = GGUFFile(path)
    p = _params(g)
    weights = 4 * sum(int(math.prod(t.shape)) for t in g.tensors.values())
    patches = (p.image_size // p.patch_size) ** 2
    return weights, 4 * patches * (6 * p.dim + 2 * p.ffn_dim)


def load_mmproj(path: str | os.PathLike) -> Gemma3Vision:
    """A Gemma 3 mmproj GGUF checked (keys, projector type, every tensor's shape) and
    dequantized to float32 (a real Gemma 3 tower: ~0.4 B parameters, ~1.7 GB)."""
    g = GGUFFile(path)
    where = str(g.path)
    if g.arch != "clip":
        raise ModelFileError(f"{where}: general.architecture is {g.arch!r}; a projector "
                             "(mmproj) file is 'clip': is this the text model?")
    proj = g.metadata.get("clip.projector_type") or g.metadata.get("clip.vision.projector_type")
    if proj != PROJECTOR:
        raise ModelFileError(f"{where}: clip.projector_type is {proj!r}; Tandem reads Gemma 3's "
                             f"({PROJECTOR!r})")
    if g.metadata.get("clip.has_vision_encoder") is not True:
        raise ModelFileError(f"{where}: clip.has_vision_encoder is "
                             f"{g.metadata.get('clip.has_vision_encoder')!r}; expected true")
    p = _params(g)
    # llama.cpp swaps a layer's ffn_up and ffn_down (weights and biases) when ffn_down's rows
    # are embedding_length long: older conversions named fc1 and fc2 the other way round
    source: dict[str, str] = {}
    for i in range(p.n_layers):
        up, down = f"v.blk.{i}.ffn_up", f"v.blk.{i}.ffn_down"
        t = g.tensors.get(down + ".weight")
        if t is not None and p.dim != p.ffn_dim and len(t.shape) == 2 and t.shape[1] == p.dim:
            for s in (".weight", ".bias"):
                source[up + s], source[down + s] = down + s, up + s
    weights: dict[str, Tensor] = {}
    for key, (shape, why) in _expected(p).items():
        name = key.rstrip("?")
        stored = source.get(name, name)
        raw = g.tensors.get(stored)
        if raw is None:
            if key.endswith("?"):
                continue
            raise ModelFileError(f"{where}: missing tensor {stored!r} ({list(shape)}: {why})")
        if tuple(raw.shape) != shape:
            raise ModelFileError(f"{where}: tensor {stored!r} has shape {list(raw.shape)}; "
                                 f"expected {list(shape)} ({why})")
        weights[name] = dequantize(raw)
        release_pages(raw.data)  # its float32 copy is what stays: the file's pages go
    w_in = g.tensors.get("mm.input_projection.weight")
    if w_in is None:
        raise ModelFileError(f"{where}: missing tensor 'mm.input_projection.weight' "
                             f"([{p.dim}, text model's embedding_length])")
    if len(w_in.shape) != 2 or w_in.shape[0] != p.dim:
        raise ModelFileError(f"{where}: tensor 'mm.input_projection.weight' has shape "
                             f"{list(w_in.shape)}; expected [{p.dim}, text embedding length] "
                             f"(clip.vision.embedding_length {p.dim} rows)")
    proj_dim = g.metadata.get("clip.vision.projection_dim", w_in.shape[1])
    if proj_dim != w_in.shape[1]:
        raise ModelFileError(f"{where}: clip.vision.projection_dim is {proj_dim!r} but "
                             f"'mm.input_projection.weight' projects to {w_in.shape[1]}")
    weights["mm.input_projection.weight"] = dequantize(w_in)
    release_pages(w_in.data)
    g.check_overlaps()
    return Gemma3Vision(p, weights, g.path)


class Gemma3Vision:
    """A loaded Gemma 3 vision tower + projector: `encode(image bytes)` -> the image's
    (tokens_per_image, text_dim) float32 embeddings, to be put between `begin` and `end`."""

    begin = BEGIN
    end = END

    def __init__(self, params: VisionParams, weights: dict[str, Tensor], path: Path) -> None:
        self.params, self.w, self.path = params, weights, path
        self.image_size = params.image_size
        self.text_dim = int(weights["mm.input_projection.weight"].shape[1])
        self.tokens_per_image = (params.side // params.n_merge) ** 2

    def check_text_model(self, args, text_path: str | os.PathLike | None = None) -> None:
        """The projection must produce the text model's embedding width (llama.cpp refuses the
        pair too: mtmd_init_from_file)."""
        if self.text_dim != args.dim:
            text = f"the text model {text_path}" if text_path else "the text model"
            raise ModelFileError(
                f"{self.path} projects images to {self.text_dim}-wide embeddings "
                f"('mm.input_projection.weight' has {self.text_dim} columns), but {text} has "
                f"embedding_length {args.dim}; use the mmproj file made with this model")

    # ---- preprocessing ----------------------------------------------------------------------

    def preprocess(self, data: bytes) -> Tensor:
        """Image bytes -> normalized (3, image_size, image_size) float32, as llama.cpp does."""
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                rgb = _to_rgb(im)
        except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as e:
            raise ImageDecodeError(f"the image cannot be decoded: {e}") from None
        return self.normalize(self.letterbox(rgb))

    def letterbox(self, rgb):
        """llama.cpp's resize with PAD_CEIL: the scale and sizes computed in float32, Pillow's
        bilinear filter (mtmd-image.cpp reimplements Pillow's Resample.c bit for bit), the
        result centred on black (its default pad colour); an image already S x S is kept."""
        from PIL import Image

        s, (w, h) = self.image_size, rgb.size
        if (w, h) == (s, s):
            return rgb
        f32 = np.float32
        scale = min(f32(s) / f32(w), f32(s) / f32(h))
        nw, nh = (min(int(np.ceil(f32(n) * scale)), s) for n in (w, h))
        canvas = Image.new("RGB", (s, s), (0, 0, 0))
        canvas.paste(rgb.resize((nw, nh), Image.Resampling.BILINEAR), ((s - nw) // 2,
                                                                      (s - nh) // 2))
        return canvas

    def normalize(self, rgb) -> Tensor:
        """uint8 RGB -> (x / 255 - mean) / std in float32, channels first."""
        x = np.asarray(rgb, dtype=np.uint8).astype(np.float32) / np.float32(255)
        x = (x - np.asarray(self.params.mean, np.float32)) / np.asarray(self.params.std,
                                                                        np.float32)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))

    def encode(self, data: bytes) -> Tensor:
        """Image bytes (JPEG, PNG, ... anything Pillow reads) -> (tokens_per_image, text_dim)."""
        return self.encode_pixels(self.preprocess(data))

    # ---- the encoder ------------------------------------------------------------------------

    def encode_pixels(self, pixels: Tensor) -> Tensor:
        """Normalized (3, image_size, image_size) pixels -> (tokens_per_image, text_dim)."""
        p, w, s = self.params, self.w, self.image_size
        if tuple(pixels.shape) != (3, s, s):
            raise TandemError(f"expected pixels of shape (3, {s}, {s}); got {list(pixels.shape)}")
        with torch.inference_mode():
            x = F.conv2d(pixels.float()[None], w["v.patch_embd.weight"],
                         w.get("v.patch_embd.bias"), stride=p.patch_size)
            x = x.flatten(2)[0].T + w["v.position_embd.weight"]  # (patches, dim), row-major
            for i in range(p.n_layers):
                x = self._layer(x, f"v.blk.{i}.")
            x = self._norm(x, "v.post_ln")
            # Gemma 3's projector: pool the grid by n_merge, RMS norm, project
            x = x.T.reshape(1, p.dim, p.side, p.side)
            x = F.avg_pool2d(x, p.n_merge).flatten(2)[0].T  # (tokens, dim), row-major
            x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + p.eps)
            x = x * w["mm.soft_emb_norm.weight"]
            return x @ w["mm.input_projection.weight"]

    def _norm(self, x: Tensor, name: str) -> Tensor:
        return F.layer_norm(x, (self.params.dim,), self.w[name + ".weight"],
                            self.w.get(name + ".bias"), self.params.eps)

    def _linear(self, x: Tensor, name: str) -> Tensor:
        return F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))

    def _layer(self, x: Tensor, b: str) -> Tensor:
        n, heads = x.shape[0], self.params.n_heads
        h = self._norm(x, b + "ln1")
        q, k, v = (self._linear(h, b + t).view(n, heads, -1).transpose(0, 1)
                   for t in ("attn_q", "attn_k", "attn_v"))
        # bidirectional; scale head_dim ** -0.5. As a batch of one (4-D), PyTorch takes its
        # blocked (flash) CPU kernel: the 3-D call built every head's patches x patches scores
        # and their softmax, 2.6 GB for Gemma 3's 4,096 patches, and was 4x slower
        a = F.scaled_dot_product_attention(q[None], k[None], v[None])[0]
        x = x + self._linear(a.transpose(0, 1).reshape(n, -1), b + "attn_out")
        h = self._linear(self._norm(x, b + "ln2"), b + "ffn_up")
        act = self.params.act
        h = (F.gelu(h, approximate="tanh") if act == "gelu" else F.silu(h) if act == "silu"
             else h * torch.sigmoid(1.702 * h))
        return x + self._linear(h, b + "ffn_down")


def _to_rgb(im):
    """Any Pillow image as 8-bit RGB. Like stb_image (llama.cpp) alpha is dropped, not blended,
    and 16-bit grey keeps its high byte (Pillow's own conversion would clip it at 255)."""
    from PIL import Image

    if im.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        a = np.asarray(im, dtype=np.int64) >> 8
        im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))  # "L"
    return im.convert("RGB")
