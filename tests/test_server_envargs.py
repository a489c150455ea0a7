"""llama-server's LLAMA_ARG_* environment variables: a flag's value where the command line sets
none, as llama-server reads them (the container images and compose files that start it)."""

from __future__ import annotations

import os

import httpx
import pytest

from tandem.cli import build_parser
from tandem.server import envargs
from tests import tiny
from tests.servers import Server


def _parse(env: dict[str, str], argv: list[str] = ()):
    serve = build_parser().commands["serve"]
    words, used = envargs.env_argv(serve, list(argv), env)
    return serve.parse_args([*words, *argv]), used


def test_variables_give_the_flags_values():
    a, used = _parse({"LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_N_PARALLEL": "3",
                      "LLAMA_ARG_TEMPERATURE": "0.25", "LLAMA_ARG_SPEC_TYPE": "ngram-simple",
                      "LLAMA_ARG_SPEC_DRAFT_P_MIN": "-1", "LLAMA_ARG_ENDPOINT_METRICS": "true",
                      "LLAMA_API_KEY": "secret", "LLAMA_ARG_FLASH_ATTN": "off",
                      "UNRELATED": "x"})
    assert (a.ctx_size, a.n_parallel, a.temperature) == (2048, 3, 0.25)
    assert a.spec_types == "ngram-simple" and a.spec_p_min == -1.0
    assert a.metrics_endpoint is True and a.api_key == "secret" and a.flash_attn == "off"
    assert "LLAMA_ARG_CTX_SIZE=2048: --ctx-size" in used
    assert not any("secret" in line for line in used)  # keys are not logged


def test_the_command_line_wins_over_a_variable():
    a, used = _parse({"LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_THREADS": "7"},
                     ["-c", "512", "--threads=1"])
    assert a.ctx_size == 512 and a.n_threads == 1
    assert "LLAMA_ARG_CTX_SIZE ignored: the command line sets --ctx-size" in used


def test_switches_take_truthy_and_falsey_values_and_the_no_spelling():
    a, _ = _parse({"LLAMA_ARG_ENDPOINT_SLOTS": "0", "LLAMA_ARG_UI": "off",
                   "LLAMA_ARG_CONTEXT_SHIFT": "enabled"})
    assert a.slots_endpoint is False and a.ui is False and a.context_shift is True
    a, _ = _parse({"LLAMA_ARG_NO_UI": "1", "LLAMA_ARG_NO_CACHE_IDLE_SLOTS": "1"})
    assert a.ui is False and a.cache_idle_slots is False
    a, _ = _parse({"LLAMA_ARG_ENDPOINT_METRICS": "false"})  # no negative: stays off
    assert a.metrics_endpoint is False


def test_a_bad_switch_value_names_the_variable(capsys):
    with pytest.raises(SystemExit) as e:
        _parse({"LLAMA_ARG_ENDPOINT_METRICS": "maybe"})
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "LLAMA_ARG_ENDPOINT_METRICS='maybe'" in err and "expected one of" in err


# every variable llama-server reads that `tandem serve` honours (each named on its setting's
# field): one that goes missing from a field would be dropped silently
VARIABLES = {
    "LLAMA_ARG_THREADS", "LLAMA_ARG_CTX_SIZE", "LLAMA_ARG_N_PREDICT", "LLAMA_ARG_BATCH",
    "LLAMA_ARG_UBATCH", "LLAMA_ARG_SWA_FULL", "LLAMA_ARG_CACHE_RAM", "LLAMA_ARG_CACHE_TYPE_K",
    "LLAMA_ARG_CACHE_TYPE_V", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
    "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", "LLAMA_ARG_KV_UNIFIED", "LLAMA_ARG_CACHE_IDLE_SLOTS",
    "LLAMA_ARG_CONTEXT_SHIFT", "LLAMA_ARG_FLASH_ATTN", "LLAMA_ARG_TEMPERATURE",
    "LLAMA_ARG_TOP_K", "LLAMA_ARG_TOP_P", "LLAMA_ARG_MIN_P", "LLAMA_ARG_BACKEND_SAMPLING",
    "LLAMA_ARG_POOLING", "LLAMA_ARG_MMPROJ", "LLAMA_ARG_MMPROJ_URL", "LLAMA_ARG_NO_MMPROJ",
    "LLAMA_ARG_MMPROJ_AUTO", "LLAMA_ARG_MMPROJ_OFFLOAD", "LLAMA_ARG_N_PARALLEL",
    "LLAMA_ARG_CONT_BATCHING", "LLAMA_ARG_N_GPU_LAYERS", "LLAMA_ARG_ALIAS", "LLAMA_ARG_TAGS",
    "LLAMA_ARG_MODEL", "LLAMA_ARG_HOST", "LLAMA_ARG_PORT", "LLAMA_ARG_CORS_ORIGINS",
    "LLAMA_ARG_AGENT", "LLAMA_ARG_UI_MCP_PROXY", "LLAMA_ARG_TOOLS", "LLAMA_ARG_TOOLS_RUNTIME",
    "LLAMA_ARG_UI", "LLAMA_ARG_EMBEDDINGS", "LLAMA_ARG_RERANKING", "LLAMA_API_KEY",
    "LLAMA_ARG_TIMEOUT", "LLAMA_ARG_ENDPOINT_METRICS", "LLAMA_ARG_ENDPOINT_SLOTS",
    "LLAMA_ARG_JINJA", "LLAMA_ARG_REASONING", "LLAMA_ARG_THINK", "LLAMA_ARG_CHAT_TEMPLATE",
    "LLAMA_ARG_CHAT_TEMPLATE_FILE", "LLAMA_ARG_OFFLINE", "LLAMA_ARG_SPEC_DRAFT_MODEL",
    "LLAMA_ARG_SPEC_DRAFT_N_MAX", "LLAMA_ARG_SPEC_DRAFT_N_MIN", "LLAMA_ARG_SPEC_DRAFT_P_MIN",
    "LLAMA_ARG_SPEC_SYNTH_LEN", "LLAMA_ARG_SPEC_SYNTH_RATES", "LLAMA_ARG_SPEC_TYPE",
    "LLAMA_ARG_DRAFT_MAX", "LLAMA_ARG_DRAFT_MIN", "LLAMA_ARG_MODELS_DIR",
    "LLAMA_ARG_MODELS_PRESET", "LLAMA_ARG_MODELS_MAX", "LLAMA_ARG_MODELS_AUTOLOAD",
    "LLAMA_ARG_HF_REPO",
}


def test_every_variable_is_named_once_on_a_flag_tandem_serve_takes():
    serve = build_parser().commands["serve"]
    named = [env for env, _ in envargs.variables(serve)]
    assert len(named) == len(set(named)) and set(named) == VARIABLES


def test_agent_applies_before_the_flags_it_sets():
    """LLAMA_ARG_AGENT gives --tools all and --ui-mcp-proxy; their own variables, read after
    it, may then say otherwise (the command line's order)."""
    a, _ = _parse({"LLAMA_ARG_AGENT": "1", "LLAMA_ARG_TOOLS": "read_file"})
    assert (a.tools, a.ui_mcp_proxy) == ("read_file", True)
    a, _ = _parse({"LLAMA_ARG_AGENT": "1"}, ["--no-ui-mcp-proxy"])
    assert (a.tools, a.ui_mcp_proxy) == ("all", False)


def test_a_server_started_from_the_environment(tmp_path):
    """`tandem serve` with its model, slots and API key from LLAMA_ARG_* alone: it serves
    them and says so in its log."""
    model = tiny.write_gguf(tiny.hf_model("qwen2", seed=0), tmp_path / "t.gguf", "qwen2")
    env = {**os.environ, "LLAMA_ARG_MODEL": str(model), "LLAMA_ARG_N_PARALLEL": "2",
           "LLAMA_ARG_CTX_SIZE": "256", "LLAMA_API_KEY": "k", "LLAMA_ARG_SPEC_TYPE": "none",
           "LLAMA_ARG_THREADS": "1"}
    s = Server(["--no-warmup"], tmp_path / "serve.log", env=env)
    try:
        s.wait_ready(120)
        assert httpx.get(f"{s.url}/props", timeout=10).status_code == 401
        props = httpx.get(f"{s.url}/props", headers={"Authorization": "Bearer k"},
                          timeout=10).json()
        assert props["total_slots"] == 2
        assert props["model_path"] == str(model)
        assert "environment: LLAMA_ARG_N_PARALLEL=2: --parallel" in s.log()
    finally:
        s.stop()
