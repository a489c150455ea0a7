"""The settings' one home: SpecConfig's rules about the draft model, per-request overrides, the
flags built from the config fields and written back out, and the request schema's defaults."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from tandem import flags
from tandem.config import EngineConfig, SamplingParams, SpecConfig
from tandem.errors import TandemError
from tandem.server.schemas import CompletionBody


def test_what_runs_with_and_without_a_draft_model():
    # nothing given: auto with a draft model, the target alone without
    assert SpecConfig().resolved(has_draft=True).types == ["suffix", "draft-simple"]
    assert SpecConfig().resolved(has_draft=True).adaptive
    assert not SpecConfig().resolved(has_draft=False).enabled
    # auto without a draft model: suffix only, still sizing drafts per step
    alone = SpecConfig(types="auto").resolved(has_draft=False)
    assert alone.types == ["suffix"] and alone.adaptive
    # draft-simple without a draft model is an error that says what to do
    with pytest.raises(TandemError, match="needs a draft model.*--model-draft"):
        SpecConfig(types="ngram-simple,draft-simple").resolved(has_draft=False)
    assert SpecConfig(types="draft-simple").uses_draft
    assert not SpecConfig(types="ngram-simple").uses_draft


def test_request_overrides_are_typed_and_resolved():
    spec = SpecConfig(types="auto").resolved(has_draft=False)
    assert spec.override({}, has_draft=False) is spec
    over = spec.override({"speculative.n_max": 8, "speculative.p_min": 0, "x": 1},
                         has_draft=False)
    assert (over.n_max, over.p_min, over.types) == (8, 0, ["suffix"])
    assert spec.override({"speculative.type": "none"}, has_draft=False).enabled is False
    for bad, word in (({"speculative.n_max": "8"}, "an integer"),
                      ({"speculative.n_max": True}, "an integer"),
                      ({"speculative.p_min": "0.5"}, "a number"),
                      ({"speculative.type": ["none"]}, "a string"),
                      ({"speculative.type": "draft-simple"}, "needs a draft model"),
                      ({"speculative.type": "eagle"}, "unknown spec type 'eagle'"),
                      ({"speculative.n_max": -1}, "must be >= 0")):
        with pytest.raises(TandemError, match=word):
            spec.override(bad, has_draft=False)
    assert over.request_view() == {"speculative.type": "suffix", "speculative.n_max": 8,
                                   "speculative.n_min": 0, "speculative.p_min": 0,
                                   "speculative.suffix_max": 16}


def _parser() -> argparse.ArgumentParser:
    p = flags.Parser(prog="t")
    flags.add_model_args(p, parallel=True)
    flags.add_spec_args(p)
    flags.add_sampling_args(p)
    return p


def test_flags_come_from_the_configs_and_go_back_out_unchanged():
    argv = ["-m", "t.gguf", "-md", "d.gguf", "-c", "2048", "-np", "3", "-t", "2",
            "--weights", "int4", "--spec-type", "ngram-simple,draft-simple", "--draft-max", "6",
            "--spec-ngram-size-n", "5", "--temp", "0", "--stop", "a", "--stop", "b",
            "--ignore-eos"]
    a = _parser().parse_args(argv)
    spec, cfg, sampling = flags.spec_config(a), flags.engine_config(a), flags.sampling_params(a)
    assert (spec.n_max, spec.ngram_max, spec.types) == (6, 5, ["ngram-simple", "draft-simple"])
    # --ctx-size is the total over the slots, as llama-server's: 2048 // 3 each
    assert (cfg.ctx_size, cfg.n_parallel, cfg.n_threads, cfg.weights) == (682, 3, 2, "int4")
    assert (sampling.temperature, sampling.stop, sampling.ignore_eos) == (0.0, ["a", "b"], True)
    again = _parser().parse_args(flags.to_argv(a, flags.add_model_args, flags.add_spec_args,
                                               flags.add_sampling_args))
    assert flags.spec_config(again) == spec and flags.sampling_params(again) == sampling
    # (to_argv writes the model flags without -np; --ctx-size goes out as the total given)
    assert again.ctx_size == 2048
    assert dataclasses.replace(flags.engine_config(again), n_parallel=3, ctx_size=682) == cfg
    # every flagged field of every config is on the command line, with its default
    defaults = _parser().parse_args([])
    for cls, prefix in ((SpecConfig, flags.SPEC_PREFIX), (EngineConfig, ""), (SamplingParams, "")):
        for f in dataclasses.fields(cls):
            if "flags" in f.metadata:
                want = f.default_factory() if f.default is dataclasses.MISSING else f.default
                assert getattr(defaults, prefix + f.name) in (want, None), f.name


def test_request_schema_defaults_are_the_sampling_defaults():
    body = CompletionBody.model_validate({"prompt": "x", "speculative.n_max": 2})
    d = SamplingParams()
    assert (body.temperature, body.top_k, body.top_p, body.min_p, body.seed) == \
        (d.temperature, d.top_k, d.top_p, d.min_p, d.seed)
    assert body.speculative == {"speculative.n_max": 2}


# -- docs/flags.md, written from the same metadata ------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "flags.md"


def test_docs_flags_md_is_what_the_metadata_writes_now():
    """A new, renamed or changed flag without `python -m tandem.flagsdoc > docs/flags.md`."""
    from tandem import flagsdoc

    assert DOC.read_text(encoding="utf-8") == flagsdoc.render(), \
        "docs/flags.md is stale: run python -m tandem.flagsdoc > docs/flags.md"


def test_every_serve_flag_is_in_docs_flags_md():
    from tandem.cli import build_parser

    text = DOC.read_text(encoding="utf-8")
    serve = build_parser().commands["serve"]
    missing = [s for a in serve._actions for s in a.option_strings
               if s not in ("-h", "--help") and f"`{s}`" not in text]
    assert missing == []
    assert "Tandem's attention is its own exact kernel" in text  # the no-effect table's reasons
