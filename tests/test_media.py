"""Images in a prompt (media.py): positions read from the projector's vectors instead of token
embeddings, seeing each other within the image, against transformers' Gemma 3 with its vision
tower (tiny, random): the same logits after the image, chunked or not, native layers or
PyTorch's; image ids reused from the cache only for the same image."""

from __future__ import annotations

import pytest
import torch

from tandem.config import EngineConfig, Numerics, SamplingParams, SpecConfig
from tandem.engine import Engine, Request
from tandem.errors import TandemError
from tandem.media import Media, media_ids
from tandem.models.decoder import KVCache, MediaRows
from tandem.models.loader import load_model

from . import tiny

IMG, BOI, EOI = 299, 297, 298  # the tiny vocabulary's ids standing in for Gemma's image tokens
N_IMG = 16


@pytest.fixture(scope="module")
def mm(tmp_path_factory):
    """(transformers' Gemma3ForConditionalGeneration, its text model as a GGUF file (F32),
    the same as Q8_0 (the native layers))."""
    import transformers
    from gguf import GGMLQuantizationType as QT

    text = tiny.hf_model("gemma3", seed=3)  # the text weights, scaled as every tiny model's
    vc = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         image_size=32, patch_size=4)
    cfg = transformers.Gemma3Config(text_config=text.config, vision_config=vc,
                                    mm_tokens_per_image=N_IMG, image_token_index=IMG,
                                    boi_token_index=BOI, eoi_token_index=EOI)
    torch.manual_seed(4)
    m = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        m.model.language_model.load_state_dict(text.model.state_dict())
        m.lm_head.weight.copy_(text.lm_head.weight)
        for name, p in m.model.multi_modal_projector.named_parameters():
            p.copy_(0.5 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p))
    d = tmp_path_factory.mktemp("media")
    return (m, tiny.write_gguf(text, d / "f32.gguf", "gemma3"),
            tiny.write_gguf(text, d / "q8.gguf", "gemma3", qtype=QT.Q8_0))


def _reference(m, ids: list[int], pixels: torch.Tensor):
    """transformers' logits for ids (image tokens where IMG) and the image's projected vectors."""
    t = torch.tensor([ids])
    with torch.no_grad():
        logits = m(input_ids=t, pixel_values=pixels, token_type_ids=(t == IMG).long()).logits[0]
        feats = m.get_image_features(pixels)
    feats = feats.pooler_output if hasattr(feats, "pooler_output") else feats
    return logits, feats.reshape(-1, feats.shape[-1])


def _prompt(pixels_seed: int = 0):
    torch.manual_seed(100 + pixels_seed)
    pixels = torch.randn(1, 3, 32, 32)
    ids = [5, 6, 7, BOI] + [IMG] * N_IMG + [EOI, 8, 9, 10, 11]
    return ids, pixels


def _ours(model, ids: list[int], start: int, vectors: torch.Tensor, chunks: list[int]):
    """Our logits for every position, the prompt fed in pieces of the given lengths."""
    mine = ids[:start] + media_ids(b"an image", N_IMG) + ids[start + N_IMG:]
    cache = KVCache(model.args, 1, 64, torch.float32)
    out, at = [], 0
    for n in chunks:
        rows = [r for r in range(n) if start <= at + r < start + N_IMG]
        media = MediaRows(rows, vectors[[at + r - start for r in rows]],
                          [start + N_IMG] * len(rows)) if rows else None
        out.append(model.model.forward_packed(mine[at: at + n], cache, [0] * n,
                                              list(range(at, at + n)), list(range(n)), media))
        at += n
    return torch.cat(out)


def test_logits_after_an_image_match_transformers(mm):
    m, f32, _ = mm
    ids, pixels = _prompt()
    want, vectors = _reference(m, ids, pixels)
    assert vectors.shape == (N_IMG, 64)
    model = load_model(f32, Numerics(dtype="float32"))
    start = ids.index(IMG)
    got = _ours(model, ids, start, vectors, [len(ids)])
    assert (got - want).abs().max().item() < 1e-4
    # the image in a pass of its own after the text before it, and the text after in one
    got = _ours(model, ids, start, vectors, [start, N_IMG, len(ids) - start - N_IMG])
    assert (got - want).abs().max().item() < 1e-4
    # the image's rows see each other: read causally, everything after it changes
    with torch.no_grad():
        t = torch.tensor([ids])
        causal = m(input_ids=t, pixel_values=pixels, token_type_ids=torch.zeros_like(t)).logits[0]
    assert (causal[start + N_IMG:] - want[start + N_IMG:]).abs().max().item() > 1e-2


def test_native_layers_read_images_as_the_pytorch_layers(mm):
    m, _, q8 = mm
    ids, pixels = _prompt()
    _, vectors = _reference(m, ids, pixels)
    model = load_model(q8, Numerics(weights="native", activations="int16"))
    assert model.model.native_layers(KVCache(model.args, 1, 64, torch.float32)) is not None
    start = ids.index(IMG)
    native = _ours(model, ids, start, vectors, [len(ids)])
    model.model._native = None  # the PyTorch layers from here on
    torch_layers = _ours(model, ids, start, vectors, [len(ids)])
    assert (native - torch_layers).abs().max().item() <= 2e-4 * torch_layers.abs().max().item()


def _engine(path, **cfg) -> Engine:
    model = load_model(path, Numerics(dtype="float32"))
    return Engine(model, None, EngineConfig(ctx_size=64, **cfg), SpecConfig(types=["none"]))


def _request(ids: list[int], vectors: torch.Tensor, data: bytes, **sp) -> Request:
    start = ids.index(IMG)
    mine = ids[:start] + media_ids(data, N_IMG) + ids[start + N_IMG:]
    return Request(mine, SamplingParams(temperature=0, n_predict=8, ignore_eos=True, **sp),
                   media=[Media(start, vectors)])


def test_engine_generates_what_transformers_does_and_reuses_only_the_same_image(mm):
    m, f32, _ = mm
    ids, pixels = _prompt()
    _, vectors = _reference(m, ids, pixels)
    t = torch.tensor([ids])
    with torch.no_grad():
        want = m.generate(input_ids=t, pixel_values=pixels, token_type_ids=(t == IMG).long(),
                          max_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
    # prompt chunks of 6 rows: one stops inside the image, which is read whole instead
    e = _engine(f32, batch_size=6)
    seq = e.generate(_request(ids, vectors, b"cat"))
    assert seq.output == want
    assert seq.timings()["cache_n"] == 0
    again = e.generate(_request(ids, vectors, b"cat"))  # the same image: all but the last
    assert again.output == want and again.timings()["prompt_n"] == 1
    _, other = _reference(m, ids, _prompt(1)[1])
    third = e.generate(_request(ids, other, b"truck"))  # another image: only the text before
    assert third.timings()["cache_n"] == ids.index(IMG)


def test_a_prompt_whose_image_ids_and_images_disagree_is_refused(mm):
    m, f32, _ = mm
    ids, pixels = _prompt()
    _, vectors = _reference(m, ids, pixels)
    e = _engine(f32)
    req = _request(ids, vectors, b"cat")
    req.media = []
    with pytest.raises(TandemError, match="outside the vocabulary"):
        e.generate(req)
    req = _request(ids, vectors, b"cat")
    req.media = [Media(2, vectors)]
    with pytest.raises(TandemError, match="hold token ids"):
        e.generate(req)
    req = _request(ids, vectors[:, :32], b"cat")
    with pytest.raises(TandemError, match="rows of 64"):
        e.generate(req)


def test_an_image_through_the_projector_gives_transformers_answer(tmp_path):
    """The whole path: a PNG decoded and letterboxed (vision.py), encoded by our SigLIP and
    projector, placed by the server's prompt builder (the media marker becomes
    <start_of_image>, the image's positions, <end_of_image>) and generated from: the same
    greedy tokens as transformers' Gemma 3 given the same pixels and positions."""
    import io

    import transformers
    from PIL import Image

    from tandem.media import marker
    from tandem.models.vision import load_mmproj
    from tandem.server import images

    from . import tiny_vision

    m = tiny_vision.hf_model(seed=2)
    vision = load_mmproj(tiny_vision.write_mmproj(m, tmp_path / "mmproj.gguf", outtype="f32"))
    text = transformers.Gemma3ForCausalLM(m.config.text_config).eval()
    with torch.no_grad():
        text.model.load_state_dict(m.model.language_model.state_dict())
        text.lm_head.weight.copy_(m.lm_head.weight)
    model = load_model(tiny.write_gguf(text, tmp_path / "text.gguf", "gemma3"),
                       Numerics(dtype="float32"))
    e = Engine(model, None, EngineConfig(ctx_size=256), SpecConfig(types=["none"]), vision)
    png = io.BytesIO()
    Image.fromarray((torch.arange(50 * 30 * 3) % 251).reshape(30, 50, 3).byte().numpy()).save(
        png, "PNG")
    ids = images.prompt(e, f"Look at this: {marker()} and say", [png.getvalue()], True, "prompt")
    assert len(ids.media) == 1 and ids.media[0].vectors.shape == (vision.tokens_per_image, 64)
    img = m.config.image_token_index
    assert img not in ids  # the text's own tokens are not the image token
    seq = e.generate(Request(ids, SamplingParams(temperature=0, n_predict=8, ignore_eos=True),
                             media=ids.media))
    t = torch.tensor([[x if x >= 0 else img for x in ids]])
    with torch.no_grad():
        want = m.generate(input_ids=t, pixel_values=vision.preprocess(png.getvalue())[None],
                          token_type_ids=(t == img).long(), max_new_tokens=8,
                          do_sample=False)[0, t.shape[1]:].tolist()
    assert seq.output == want
