"""llama-server's environment variables (LLAMA_ARG_*): a flag's value from the environment.

As llama-server reads them (common/arg.cpp): a variable gives its flag's value when the command
line does not set it (the command line wins); a flag that takes no value is set by a truthy value
(1, true, on, enabled) and, where it has a negative spelling (--no-slots), unset by a falsey one
(0, false, off, disabled); LLAMA_ARG_NO_X gives --x's falsey value. Only the variables of flags
that `tandem serve` takes are read; each one used is logged by `run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

# llama-server's variable -> its flag spellings (the first one tandem serve knows is used)
ENV_FLAGS: dict[str, tuple[str, ...]] = {
    "LLAMA_ARG_THREADS": ("--threads",),
    "LLAMA_ARG_CTX_SIZE": ("--ctx-size",),
    "LLAMA_ARG_N_PREDICT": ("--n-predict", "--predict"),
    "LLAMA_ARG_BATCH": ("--batch-size",),
    "LLAMA_ARG_UBATCH": ("--ubatch-size",),
    "LLAMA_ARG_SWA_FULL": ("--swa-full",),
    "LLAMA_ARG_CACHE_RAM": ("--cache-ram",),
    "LLAMA_ARG_CACHE_TYPE_K": ("--cache-type-k",),
    "LLAMA_ARG_CACHE_TYPE_V": ("--cache-type-v",),
    "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K": ("--spec-draft-type-k", "--cache-type-k-draft"),
    "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V": ("--spec-draft-type-v", "--cache-type-v-draft"),
    "LLAMA_ARG_KV_UNIFIED": ("--kv-unified",),
    "LLAMA_ARG_CACHE_IDLE_SLOTS": ("--cache-idle-slots",),
    "LLAMA_ARG_CONTEXT_SHIFT": ("--context-shift",),
    "LLAMA_ARG_FLASH_ATTN": ("--flash-attn",),
    "LLAMA_ARG_TEMPERATURE": ("--temp", "--temperature"),
    "LLAMA_ARG_TOP_K": ("--top-k",),
    "LLAMA_ARG_TOP_P": ("--top-p",),
    "LLAMA_ARG_MIN_P": ("--min-p",),
    "LLAMA_ARG_BACKEND_SAMPLING": ("--backend-sampling",),
    "LLAMA_ARG_POOLING": ("--pooling",),
    "LLAMA_ARG_MMPROJ": ("--mmproj",),
    "LLAMA_ARG_MMPROJ_URL": ("--mmproj-url",),
    "LLAMA_ARG_NO_MMPROJ": ("--no-mmproj",),
    "LLAMA_ARG_MMPROJ_AUTO": ("--mmproj-auto",),
    "LLAMA_ARG_MMPROJ_OFFLOAD": ("--mmproj-offload",),
    "LLAMA_ARG_N_PARALLEL": ("--parallel",),
    "LLAMA_ARG_CONT_BATCHING": ("--cont-batching",),
    "LLAMA_ARG_N_GPU_LAYERS": ("--n-gpu-layers", "--gpu-layers"),
    "LLAMA_ARG_ALIAS": ("--alias",),
    "LLAMA_ARG_TAGS": ("--tags",),
    "LLAMA_ARG_MODEL": ("--model",),
    "LLAMA_ARG_HOST": ("--host",),
    "LLAMA_ARG_PORT": ("--port",),
    "LLAMA_ARG_CORS_ORIGINS": ("--cors-origins",),
    "LLAMA_ARG_AGENT": ("--agent",),  # before the two it sets, which then may override it
    "LLAMA_ARG_UI_MCP_PROXY": ("--ui-mcp-proxy", "--webui-mcp-proxy"),
    "LLAMA_ARG_TOOLS": ("--tools",),
    "LLAMA_ARG_TOOLS_RUNTIME": ("--tools-runtime",),
    "LLAMA_ARG_UI": ("--ui", "--webui"),
    "LLAMA_ARG_EMBEDDINGS": ("--embedding", "--embeddings"),
    "LLAMA_ARG_RERANKING": ("--reranking", "--rerank"),
    "LLAMA_API_KEY": ("--api-key",),
    "LLAMA_ARG_TIMEOUT": ("--timeout",),
    "LLAMA_ARG_ENDPOINT_METRICS": ("--metrics",),
    "LLAMA_ARG_ENDPOINT_SLOTS": ("--slots",),
    "LLAMA_ARG_JINJA": ("--jinja",),
    "LLAMA_ARG_REASONING": ("--reasoning",),
    "LLAMA_ARG_CHAT_TEMPLATE": ("--chat-template",),
    "LLAMA_ARG_CHAT_TEMPLATE_FILE": ("--chat-template-file",),
    "LLAMA_ARG_OFFLINE": ("--offline",),
    "LLAMA_ARG_SPEC_DRAFT_MODEL": ("--model-draft", "--spec-draft-model"),
    "LLAMA_ARG_SPEC_DRAFT_N_MAX": ("--spec-draft-n-max", "--draft-max"),
    "LLAMA_ARG_SPEC_DRAFT_N_MIN": ("--spec-draft-n-min", "--draft-min"),
    "LLAMA_ARG_SPEC_DRAFT_P_MIN": ("--spec-draft-p-min", "--draft-p-min"),
    "LLAMA_ARG_SPEC_SYNTH_LEN": ("--spec-synth-len",),
    "LLAMA_ARG_SPEC_SYNTH_RATES": ("--spec-synth-rates",),
    "LLAMA_ARG_SPEC_TYPE": ("--spec-type",),
    "LLAMA_ARG_DRAFT_MAX": ("--draft-max", "--spec-draft-n-max"),
    "LLAMA_ARG_DRAFT_MIN": ("--draft-min", "--spec-draft-n-min"),
}

TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")


def _negative(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    """The spelling that unsets `action`'s destination (--no-slots for --slots), if any."""
    own = [s for s in action.option_strings if s.startswith("--no-")]
    if own:  # --cache-idle-slots / --no-cache-idle-slots, --agent / --no-agent
        return own[0]
    for other in parser._actions:
        if other.dest == action.dest and isinstance(other, argparse._StoreFalseAction):
            return other.option_strings[-1]
    return None


def env_argv(parser: argparse.ArgumentParser, argv: list[str],
             environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The command-line words the environment adds in front of argv (argv, read after them,
    wins), and a log line per variable used. A variable whose flag's destination argv already
    sets is left out. A bad boolean value is a parser error naming the variable."""
    known = parser._option_string_actions
    given = set()
    for word in argv:
        name = word.split("=", 1)[0]
        if name in known:
            given.add(known[name].dest)
    words: list[str] = []
    used: list[str] = []
    for env, spellings in ENV_FLAGS.items():
        neg_env = env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)
        flag = next((s for s in spellings if s in known), None)
        if flag is None:
            continue
        action = known[flag]
        negative = _negative(parser, action)
        if negative and neg_env in environ:
            env, value = neg_env, "0"
            shown = environ[neg_env]
        elif env in environ:
            value = shown = environ[env]
        else:
            continue
        if action.dest in given:
            used.append(f"{env} ignored: the command line sets {flag}")
            continue
        if action.nargs == 0:  # a flag without a value
            if value.lower() in TRUTHY:
                added = [flag]
            elif value.lower() in FALSEY:
                added = [negative] if negative else []
            else:
                parser.error(f"environment variable {env}={value!r}: expected one of "
                             f"{', '.join(TRUTHY + FALSEY)}")
        else:
            added = [f"{flag}={value}"]
        words += added
        shown = "***" if "KEY" in env else shown
        used.append(f"{env}={shown}: {' '.join(a.split('=')[0] for a in added) or 'nothing'}")
    return words, used
