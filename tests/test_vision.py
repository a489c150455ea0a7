"""Gemma 3's image side (tandem.models.vision) against transformers and llama.cpp's rules: the
encoder and projector equal Gemma3ForConditionalGeneration's image features; images are fitted
into the square as llama.cpp fits them (aspect kept, Pillow's bilinear filter, black bars);
bad mmproj files and undecodable images are refused with the file, key or tensor named."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from tandem.errors import ModelFileError, TandemError
from tandem.models.args import ModelArgs
from tandem.models.vision import Gemma3Vision, ImageDecodeError, load_mmproj

from . import tiny, tiny_vision

REL_TOL = 1e-4  # of the output's largest magnitude; measured ~4e-7 (float32 both sides)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """(transformers model, its mmproj loaded): 64 x 64 images, 16 x 16 patches pooled 2 x 2."""
    model = tiny_vision.hf_model(seed=1)
    path = tiny_vision.write_mmproj(model, tmp_path_factory.mktemp("mmproj") / "mm.gguf")
    return model, load_mmproj(path)


def png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")  # the mode from the array: L, RGB, RGBA, I;16
    return buf.getvalue()


def gradient(w: int, h: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 7 % 256],
                    -1).astype(np.uint8)


def close(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| relative to max |ref|."""
    assert ours.shape == ref.shape
    return float((ours - ref).abs().max() / ref.abs().max())


# ---- the encoder against transformers ----------------------------------------------------------


@pytest.mark.parametrize("tokens, outtype, vision", [
    (64, "f16", {}),  # pooled 2 x 2: clip.vision.projector.scale_factor written
    (16, "f32", {}),  # pooled 4 x 4: the key left out, llama.cpp's default 4
    (256, "f16", dict(image_size=896, patch_size=14, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2)),  # real Gemma 3's geometry
], ids=["merge2", "merge4-default", "gemma3-geometry"])
def test_encoder_matches_transformers(tmp_path, tokens, outtype, vision):
    model = tiny_vision.hf_model(seed=2, tokens_per_image=tokens, **vision)
    v = load_mmproj(tiny_vision.write_mmproj(model, tmp_path / "mm.gguf", outtype=outtype))
    size = model.config.vision_config.image_size
    assert (v.tokens_per_image, v.text_dim, v.image_size) == (tokens, 64, size)
    assert (v.begin, v.end) == ("<start_of_image>", "<end_of_image>")
    torch.manual_seed(0)
    pixels = torch.rand(3, size, size) * 2 - 1
    ours, ref = v.encode_pixels(pixels), tiny_vision.reference(model, pixels)
    assert ours.dtype == torch.float32
    assert close(ours, ref) <= REL_TOL
    assert ref.std() > 0.3  # informative: not washed out by the random weights


def test_legacy_swapped_ffn_names(tmp_path, tiny_pair):
    """Older conversions named fc1 'ffn_down' and fc2 'ffn_up'; llama.cpp swaps them back."""
    model, v = tiny_pair
    sd = model.state_dict()
    replace = {}
    for i in range(2):
        fc = f"model.vision_tower.encoder.layers.{i}.mlp.fc"
        for s in ("weight", "bias"):
            replace[f"v.blk.{i}.ffn_up.{s}"] = sd[f"{fc}2.{s}"].numpy()
            replace[f"v.blk.{i}.ffn_down.{s}"] = sd[f"{fc}1.{s}"].numpy()
    swapped = load_mmproj(tiny_vision.write_mmproj(model, tmp_path / "old.gguf", replace=replace))
    pixels = torch.rand(3, 64, 64)
    assert torch.equal(swapped.encode_pixels(pixels), v.encode_pixels(pixels))


# ---- preprocessing -----------------------------------------------------------------------------


def test_square_image_matches_transformers_processor(tiny_pair):
    """A square image: fitting and stretching agree, so Hugging Face's processor (Pillow,
    bilinear, 1/255, mean and std 0.5) gives the same pixels and the same features."""
    from transformers import Gemma3ImageProcessorPil

    model, v = tiny_pair
    a = np.random.default_rng(0).integers(0, 256, (100, 100, 3), dtype=np.uint8)
    data = png(a)
    hf = Gemma3ImageProcessorPil(size={"height": 64, "width": 64})
    ref_pixels = hf(Image.open(io.BytesIO(data)), return_tensors="pt")["pixel_values"][0]
    assert torch.allclose(v.preprocess(data), ref_pixels.float(), atol=1e-6)
    assert close(v.encode(data), tiny_vision.reference(model, ref_pixels)) <= REL_TOL


@pytest.mark.parametrize("w, h", [(50, 30), (30, 50)])
def test_letterbox_as_llama_cpp(tiny_pair, w, h):
    """llama.cpp (PAD_CEIL, Gemma 3's bilinear filter) keeps the aspect: a 50 x 30 image is
    resized to 64 x ceil(30 * 64 / 50) = 64 x 39 and centred on black, which normalizes to -1."""
    _, v = tiny_pair
    data = png(gradient(w, h))
    n = int(np.ceil(min(w, h) * 64 / max(w, h)))
    size = (64, n) if w > h else (n, 64)
    canvas = np.zeros((64, 64, 3), np.uint8)
    inner = np.asarray(Image.open(io.BytesIO(data)).resize(size, Image.Resampling.BILINEAR))
    top, left = (64 - size[1]) // 2, (64 - size[0]) // 2
    canvas[top:top + size[1], left:left + size[0]] = inner
    expected = torch.from_numpy((canvas.astype(np.float32) / 255 - 0.5) / 0.5).permute(2, 0, 1)
    pixels = v.preprocess(data)
    assert torch.equal(pixels, expected)
    assert pixels[:, :top].eq(-1).all() and pixels[:, :, :left].eq(-1).all()
    assert torch.equal(v.encode(data), v.encode_pixels(expected))


def test_letterbox_sizes_in_float32(tiny_pair):
    """llama.cpp computes the scale in float32: 28 x 21 fills ceil(21 * float32(64 / 28)) = 49
    rows (exact arithmetic would give 48); checked against libmtmd."""
    _, v = tiny_pair
    a = np.full((21, 28, 3), 200, np.uint8)
    rows = v.preprocess(png(a))[0].gt(-1).any(1)
    assert int(rows.sum()) == 49


def test_image_modes_as_stb_image(tiny_pair):
    """Alpha dropped (not blended), grey replicated, 16-bit grey by its high byte: as llama.cpp's
    stb_image decodes them."""
    _, v = tiny_pair
    rgba = np.random.default_rng(1).integers(0, 256, (20, 30, 4), dtype=np.uint8)
    assert torch.equal(v.preprocess(png(rgba)), v.preprocess(png(rgba[..., :3].copy())))
    grey = np.random.default_rng(2).integers(0, 256, (20, 30), dtype=np.uint8)
    assert torch.equal(v.preprocess(png(grey)),
                       v.preprocess(png(np.repeat(grey[..., None], 3, -1))))
    grey16 = np.random.default_rng(3).integers(0, 65536, (20, 30), dtype=np.uint16)
    assert torch.equal(v.preprocess(png(grey16)), v.preprocess(png((grey16 >> 8).astype(np.uint8))))


def test_jpeg_encodes(tiny_pair):
    _, v = tiny_pair
    buf = io.BytesIO()
    Image.fromarray(gradient(120, 80)).save(buf, "JPEG", quality=90)
    out = v.encode(buf.getvalue())
    assert out.shape == (v.tokens_per_image, v.text_dim) and torch.isfinite(out).all()


# ---- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, words", [
    (dict(projector_type="llava"), ["clip.projector_type is 'llava'", "'gemma3'"]),
    (dict(skip=("v.blk.1.attn_q.weight",)), ["missing tensor 'v.blk.1.attn_q.weight'", "[48, 48]"]),
    (dict(skip=("mm.input_projection.weight",)), ["missing tensor 'mm.input_projection.weight'"]),
    (dict(replace={"mm.soft_emb_norm.weight": np.ones(47, np.float32)}),
     ["'mm.soft_emb_norm.weight' has shape [47]", "expected [48]", "embedding_length 48"]),
    (dict(replace={"v.position_embd.weight": np.ones((255, 48), np.float32)}),
     ["'v.position_embd.weight' has shape [255, 48]", "expected [256, 48]"]),
    (dict(keys={"clip.vision.image_size": None}),
     ["missing GGUF metadata 'clip.vision.image_size'"]),
    (dict(keys={"clip.vision.projector.scale_factor": 3}), ["scale_factor 3", "16 x 16"]),
    (dict(keys={"clip.has_vision_encoder": False}), ["clip.has_vision_encoder is False"]),
    (dict(keys={"clip.vision.projection_dim": 32}), ["projection_dim is 32", "projects to 64"]),
], ids=["projector", "missing-q", "missing-proj", "norm-shape", "pos-shape", "missing-key",
        "bad-merge", "no-vision", "proj-dim"])
def test_bad_mmproj_refused(tmp_path, tiny_pair, change, words):
    model, _ = tiny_pair
    path = tiny_vision.write_mmproj(model, tmp_path / "bad.gguf", **change)
    with pytest.raises(ModelFileError) as e:
        load_mmproj(path)
    assert str(path) in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_text_model_as_mmproj_refused(tmp_path):
    path = tiny.write_gguf(tiny.hf_model("gemma3"), tmp_path / "text.gguf", "gemma3")
    with pytest.raises(ModelFileError, match="general.architecture is 'gemma3'.*'clip'"):
        load_mmproj(path)


def test_check_text_model(tiny_pair):
    _, v = tiny_pair
    args = dict(arch="gemma3", n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=300)
    v.check_text_model(ModelArgs(dim=64, **args))
    with pytest.raises(ModelFileError) as e:
        v.check_text_model(ModelArgs(dim=96, **args), "text.gguf")
    assert all(w in str(e.value) for w in (str(v.path), "64", "text.gguf", "96"))


@pytest.mark.parametrize("data", [b"", b"not an image", png(gradient(20, 20))[:60]],
                         ids=["empty", "text", "truncated-png"])
def test_undecodable_image(tiny_pair, data):
    _, v = tiny_pair
    with pytest.raises(ImageDecodeError, match="the image cannot be decoded: ") as e:
        v.encode(data)
    assert isinstance(e.value, TandemError) and isinstance(e.value, ValueError)


def test_pixels_of_another_size_refused(tiny_pair):
    _, v = tiny_pair
    assert isinstance(v, Gemma3Vision)
    with pytest.raises(TandemError, match=r"\(3, 64, 64\)"):
        v.encode_pixels(torch.zeros(3, 32, 32))
