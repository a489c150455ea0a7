"""`tandem serve`'s settings, each spelled once: a field names its flag, aliases, LLAMA_ARG_*
variable and default in its metadata (`config.flag`), from which flags.py builds the parser,
envargs.py reads the environment and docs/flags.md is written (tandem/flagsdoc.py).

ServerSettings holds what the server needs; its __post_init__ checks every value before the
socket listens (a typo fails at once, not after loading) and applies the rules that tie one
setting to another. IgnoredFlags is the table of llama-server's flags that Tandem accepts and
ignores, each with the reason, said once in the log when a command line gives one.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from dataclasses import dataclass, field

from ..choices import FLASH_ATTN, POOLING, REASONING, REASONING_FORMAT
from ..config import EngineConfig, SamplingParams, SpecConfig, flag
from ..errors import TandemError

log = logging.getLogger("tandem.server")

MAX_BODY_BYTES = 10 * 1024 * 1024
QUEUE_PER_SLOT = 4  # requests that may wait per slot, unless --queue-size says otherwise
API_KEY_ENV = "TANDEM_API_KEY"  # --api-key's default


class Agent(argparse.Action):
    """llama-server's --agent: --tools all and --ui-mcp-proxy (neither with --no-agent), in the
    command line's order with those two flags."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        on = option_string in ("-ag", "--agent")
        namespace.agent = on
        namespace.tools, namespace.ui_mcp_proxy = ("all" if on else None), on


def _words(value: str | list[str] | None) -> list[str]:
    """A comma-separated flag's words (a list given as one stays as it is)."""
    if isinstance(value, list):
        return value
    return [w.strip() for w in (value or "").split(",") if w.strip()]


@dataclass(slots=True)
class ServerSettings:
    """The command line, checked: the models to load, the engine's, speculation's and the
    default sampling's configs (built from their own flags), and what the HTTP layer needs."""

    model: str = "default"
    model_draft: str | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    spec: SpecConfig = field(default_factory=lambda: SpecConfig(types=["none"]))
    # the server's sampling flags (--temp, --top-k, ..., -n, --stop): every request's defaults
    # for the fields it does not send
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_body_bytes: int = MAX_BODY_BYTES
    host: str = field(default="127.0.0.1", metadata=flag(
        "--host", env="LLAMA_ARG_HOST",
        help="address(es) to listen on, comma-separated, IPv6 ones in [brackets] or not"))
    port: int = field(default=8080, metadata=flag(
        "--port", env="LLAMA_ARG_PORT", help="port to listen on (0: any free one)"))
    api_key: str | None = field(default=None, metadata=flag(
        "--api-key", type=str, metavar="KEY", env="LLAMA_API_KEY",
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}; none)"))
    timeout: float = field(default=600.0, metadata=flag(
        "-to", "--timeout", env="LLAMA_ARG_TIMEOUT",
        help="seconds a request may take: reading it, waiting and generating"))
    alias: str | None = field(default=None, metadata=flag(
        "-a", "--alias", env="LLAMA_ARG_ALIAS",
        help="model name(s) the API reports, comma-separated; the id is the first in "
             "alphabetical order, as llama-server's"))
    tags: list[str] = field(default=None, metadata=flag(
        "--tags", type=str, metavar="TAG1,TAG2,...", env="LLAMA_ARG_TAGS",
        help="comma-separated tags GET /v1/models reports for the model"))
    max_queue: int | None = field(default=None, metadata=flag(
        "--queue-size", type=int,
        help=f"requests that may wait for a slot before new ones get 503 (default: "
             f"{QUEUE_PER_SLOT} x --parallel)"))
    sleep_idle_seconds: int = field(default=-1, metadata=flag(
        "--sleep-idle-seconds", metavar="SECONDS",
        help="after SECONDS with no request for the model, it leaves memory (weights, KV "
             "caches, the host prompt cache) and the server keeps listening; the next request "
             "that needs it loads it again. /health, /props (\"is_sleeping\"), /models and "
             "/metrics answer without waking it (-1: never, the default)"))
    no_warmup: bool = field(default=False, metadata=flag(
        "--no-warmup", help="skip the short warm-up generation after loading"))
    offline: bool = field(default=False, metadata=flag(
        "--offline", env="LLAMA_ARG_OFFLINE",
        help="never download: a model name that is not pulled yet is an error"))
    verbose: bool = field(default=False, metadata=flag(
        "-v", "--verbose", help="log more (debug); answers carry \"__verbose\" (the prompt "
                                "and the raw result)"))
    ubatch_size: int | None = field(default=None, metadata=flag(
        "-ub", "--ubatch-size", type=int, env="LLAMA_ARG_UBATCH",
        help="llama-server's physical batch: Tandem's passes have one size, so the smaller of "
             "--batch-size and this is the most rows a pass carries"))
    context_shift: bool = field(default=False, metadata=flag(
        "--context-shift", off=("--no-context-shift",), env="LLAMA_ARG_CONTEXT_SHIFT",
        help="when a slot's context is full, drop half of the tokens after the request's "
             "n_keep (default 0; -1: the prompt) and go on generating; the answer is then "
             "marked truncated (default: stop the generation, as llama-server's)"))
    cache_idle_slots: bool | None = field(default=None, metadata=flag(
        "--cache-idle-slots", off=("--no-cache-idle-slots",), env="LLAMA_ARG_CACHE_IDLE_SLOTS",
        help="with the host prompt cache on (--cache-ram, on by default): when a request "
             "starts, every idle slot's cached tokens are copied there, and with --kv-unified "
             "the slot is cleared, its room given to the shared context; a prompt that starts "
             "the same way later is read back from host memory (default on, as "
             "llama-server's; --no-cache-idle-slots: an idle slot keeps its tokens until its "
             "room or the slot is needed)"))
    slots_endpoint: bool = field(default=True, metadata=flag(
        "--slots", off=("--no-slots",), env="LLAMA_ARG_ENDPOINT_SLOTS",
        help="serve GET /slots (the default)"))
    metrics_endpoint: bool = field(default=False, metadata=flag(
        "--metrics", env="LLAMA_ARG_ENDPOINT_METRICS",
        help="serve GET /metrics (Prometheus text, llama-server's llamacpp: series)"))
    slot_save_path: str | None = field(default=None, metadata=flag(
        "--slot-save-path", metavar="DIR",
        help="folder for slot files: POST /slots/ID?action=save|restore {\"filename\"} writes "
             "or reads a slot's cache there (off without it)"))
    ui: bool = field(default=True, metadata=flag(
        "--ui", "--webui", off=("--no-ui", "--no-webui"), env="LLAMA_ARG_UI",
        help="serve the web page at / (the default; off, / answers 404)"))
    embeddings: bool = field(default=False, metadata=flag(
        "--embedding", "--embeddings", env="LLAMA_ARG_EMBEDDINGS",
        help="serve embeddings (POST /v1/embeddings, /embedding): the target's final hidden "
             "states, pooled (--pooling) and normalized"))
    pooling: str = field(default="last", metadata=flag(
        "--pooling", choices=POOLING, env="LLAMA_ARG_POOLING",
        help="how an embedding pools the hidden states: last (the token that has read the "
             "whole input; the default for causal models), mean, cls (the first token), none "
             "(one vector per token, /embedding only), rank (a reranker's classification head "
             "on the last token: POST /rerank)"))
    reranking: bool = field(default=False, metadata=flag(
        "--reranking", "--rerank", env="LLAMA_ARG_RERANKING",
        help="serve POST /rerank (--embedding --pooling rank): a reranker GGUF with a "
             "classification head (cls.output, e.g. Qwen3-Reranker) scores each document "
             "against the query"))
    chat_template: str | None = field(default=None, metadata=flag(
        "--chat-template", env="LLAMA_ARG_CHAT_TEMPLATE",
        help="a Jinja chat template (text) to use instead of the model's, or one of "
             "llama-server's built-in names: chatml, llama3, command-r, gemma, phi3"))
    chat_template_file: str | None = field(default=None, metadata=flag(
        "--chat-template-file", metavar="FILE", env="LLAMA_ARG_CHAT_TEMPLATE_FILE",
        help="a Jinja chat template file to use instead of the model's"))
    reasoning: str = field(default="auto", metadata=flag(
        "--reasoning", "-rea", choices=REASONING, env="LLAMA_ARG_REASONING",
        help="thinking in chat templates that have it (Qwen3, DeepSeek-R1, QwQ, Command R7B): "
             "on/off set the template's enable_thinking, off also closes a thought the "
             "template opens; auto leaves the template be"))
    reasoning_format: str = field(default="auto", metadata=flag(
        "--reasoning-format", choices=REASONING_FORMAT, metavar="FORMAT",
        env="LLAMA_ARG_THINK",
        help="where a chat answer's thought (<think> ... </think>) goes: none leaves it in the "
             "content; deepseek puts it in reasoning_content (Anthropic: a thinking block; "
             "Responses: a reasoning item); deepseek-legacy keeps it in the content too; auto "
             "is deepseek. A request's reasoning_format overrides it"))
    mmproj: str | None = field(default=None, metadata=flag(
        "--mmproj", "-mm", metavar="FILE", env="LLAMA_ARG_MMPROJ",
        help="the target's multimodal projector (a Gemma 3 mmproj GGUF): images in chat "
             "image_url parts and /completion's multimodal_data"))
    mmproj_url: str | None = field(default=None, metadata=flag(
        "--mmproj-url", "-mmu", metavar="URL", env="LLAMA_ARG_MMPROJ_URL",
        help="refused: Tandem downloads nothing; give --mmproj FILE"))
    no_mmproj: bool = field(default=False, metadata=flag(
        "--no-mmproj", env="LLAMA_ARG_NO_MMPROJ",
        help="no multimodal projector, even with --mmproj"))
    media_path: str | None = field(default=None, metadata=flag(
        "--media-path", metavar="DIR",
        help="a folder images may be read from as file:// URLs (relative paths, no '..'); "
             "off without it"))
    cors_origins: list[str] = field(default=None, metadata=flag(
        "--cors-origins", type=str, metavar="ORIGIN1,ORIGIN2,...", env="LLAMA_ARG_CORS_ORIGINS",
        help="origins a browser may call the API from, comma-separated; 'localhost' = any "
             "port of localhost, 127.0.0.1, [::1]; '*' = any (the default; 'localhost' with "
             "--tools)"))
    # before the two it sets, so that their variables may override LLAMA_ARG_AGENT's
    agent: bool | None = field(default=None, metadata=flag(
        "-ag", "--agent", "-no-ag", "--no-agent", action=Agent, env="LLAMA_ARG_AGENT",
        help="--tools all and --ui-mcp-proxy together (--no-agent: neither)"))
    ui_mcp_proxy: bool = field(default=False, metadata=flag(
        "--ui-mcp-proxy", "--webui-mcp-proxy", off=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
        env="LLAMA_ARG_UI_MCP_PROXY",
        help="experimental: serve GET/POST /cors-proxy?url=URL, which forwards a request for "
             "the web page's MCP servers - do not enable in untrusted environments (default: "
             "off, 403; needs the agent extra)"))
    tools: list[str] = field(default=None, metadata=flag(
        "--tools", type=str, metavar="TOOL1,TOOL2,...", env="LLAMA_ARG_TOOLS",
        help="experimental: built-in tools for AI agents at GET/POST /tools - do not enable in "
             "untrusted environments (default: none); 'all' for every one of read_file, "
             "file_glob_search, grep_search, exec_shell_command, write_file, edit_file, "
             "get_info; --cors-origins then defaults to localhost (needs the agent extra: "
             "pip install 'tandem[agent]')"))
    tools_runtime: str | None = field(default=None, metadata=flag(
        "--tools-runtime", metavar="OPTION", env="LLAMA_ARG_TOOLS_RUNTIME",
        help="experimental: where the tools run (default: this machine): 'docker:<image>', "
             "'podman:<image>' (a container started now, removed at exit), "
             "'docker-container:<id>', 'podman-container:<id>' (a running one), "
             "'ssh:<target>' (a POSIX host; key auth, trusted host key)"))

    def __post_init__(self) -> None:
        if self.api_key is None:
            self.api_key = os.environ.get(API_KEY_ENV) or None
        self._check_numbers()
        self._apply_engine_rules()
        if self.reranking:  # as llama-server: embeddings on, pooled by the ranking head
            self.embeddings, self.pooling = True, "rank"
        self._check_files()
        self.chat_template = _chat_template(self.chat_template, self.chat_template_file)
        if not isinstance(self.tags, list):  # split as llama-server's, spaces kept
            self.tags = [t for t in (self.tags or "").split(",") if t]
        self._apply_tool_rules()

    @property
    def warmup(self) -> bool:
        return not self.no_warmup

    def _check_numbers(self) -> None:
        if not 0 <= self.port <= 65535:
            raise TandemError(f"--port must be 0..65535, got {self.port}")
        if not self.timeout > 0:
            raise TandemError(f"--timeout must be > 0 seconds, got {self.timeout:g}")
        if self.max_queue is None:
            self.max_queue = QUEUE_PER_SLOT * self.engine.n_parallel
        if self.max_queue < 0:
            raise TandemError(f"--queue-size must be >= 0, got {self.max_queue}")
        if self.sleep_idle_seconds == 0 or self.sleep_idle_seconds < -1:
            raise TandemError(f"--sleep-idle-seconds must be > 0, or -1 (never), got "
                              f"{self.sleep_idle_seconds}")
        if self.ubatch_size is not None and self.ubatch_size < 2:
            raise TandemError(f"--ubatch-size must be >= 2, got {self.ubatch_size}")

    def _apply_engine_rules(self) -> None:
        """-ub caps a pass with -b; --context-shift is the engine's; idle slots are cached
        only where the host prompt cache is on."""
        engine = self.engine
        if self.ubatch_size is not None:
            engine = dataclasses.replace(engine, batch_size=min(engine.batch_size,
                                                                self.ubatch_size))
        if self.context_shift:
            engine = dataclasses.replace(engine, context_shift=True)
        idle = self.cache_idle_slots is not False
        if idle and engine.cache_ram == 0:
            if self.cache_idle_slots:
                log.warning("--cache-idle-slots requires --cache-ram, disabling")
            idle = False
        self.cache_idle_slots = idle
        self.engine = dataclasses.replace(engine, cache_idle_slots=idle)

    def _check_files(self) -> None:
        if self.slot_save_path is not None and not os.path.isdir(self.slot_save_path):
            raise TandemError(f"--slot-save-path {self.slot_save_path}: no such folder")
        if self.mmproj_url is not None:
            raise TandemError(f"--mmproj-url {self.mmproj_url}: Tandem downloads nothing; "
                              "download the file and give --mmproj FILE")
        if self.no_mmproj:
            self.mmproj = None
        if self.mmproj is not None and not os.path.isfile(self.mmproj):
            raise TandemError(f"--mmproj {self.mmproj}: no such file")
        if self.media_path is not None and not os.path.isdir(self.media_path):
            raise TandemError(f"--media-path {self.media_path}: no such folder")

    def _apply_tool_rules(self) -> None:
        """--tools narrows CORS to localhost unless --cors-origins says otherwise;
        --tools-runtime means nothing without --tools."""
        self.tools = _words(self.tools)
        if self.cors_origins is None:
            self.cors_origins = "localhost" if self.tools else "*"
            if self.tools:
                log.warning("server tools are enabled, using localhost as default CORS origin "
                            "(change via --cors-origins)")
        self.cors_origins = _words(self.cors_origins)
        if self.tools_runtime and not self.tools:
            log.info("--tools-runtime %s: no effect without --tools", self.tools_runtime)
            self.tools_runtime = None


def _chat_template(text: str | None, path: str | None) -> str | None:
    """--chat-template-file's text, or --chat-template's (a template, or a built-in name)."""
    from ..tokenizer import BUILTIN_TEMPLATES

    if path is not None and text is not None:
        raise TandemError("give --chat-template or --chat-template-file, not both")
    if path is not None:
        try:
            return open(path, encoding="utf-8").read()
        except OSError as e:
            raise TandemError(f"--chat-template-file {path}: {e.strerror or e}") from None
    if text is None:
        return None
    if text in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[text]
    if "{%" not in text and "{{" not in text:
        raise TandemError(f"--chat-template {text!r}: not a Jinja template, and of "
                          f"llama-server's built-in names Tandem knows "
                          f"{', '.join(BUILTIN_TEMPLATES)}; pass the template's text or "
                          "--chat-template-file")
    return text


@dataclass(slots=True)
class IgnoredFlags:
    """llama-server's flags that Tandem accepts and ignores, so that its command lines run
    unchanged. Each field's help is the reason it has no effect; building this from a command
    line logs, once, every one given a value other than its default (`__post_init__`)."""

    flash_attn: str | None = field(default=None, metadata=flag(
        "-fa", "--flash-attn", choices=FLASH_ATTN, const="on", env="LLAMA_ARG_FLASH_ATTN",
        help="Tandem's attention is its own exact kernel"))
    jinja: bool = field(default=True, metadata=flag(
        "--jinja", off=("--no-jinja",), env="LLAMA_ARG_JINJA",
        help="Tandem always renders the model's Jinja template"))
    n_gpu_layers: str | None = field(default=None, metadata=flag(
        "-ngl", "--n-gpu-layers", "--gpu-layers", metavar="N", env="LLAMA_ARG_N_GPU_LAYERS",
        help="Tandem runs on the CPU"))
    cont_batching: bool = field(default=True, metadata=flag(
        "-cb", "--cont-batching", env="LLAMA_ARG_CONT_BATCHING",
        help="Tandem always batches slots continuously"))
    swa_full: bool = field(default=False, metadata=flag(
        "--swa-full", env="LLAMA_ARG_SWA_FULL",
        help="Tandem's cache keeps every position of every layer"))
    backend_sampling: bool = field(default=False, metadata=flag(
        "--backend-sampling", "--backend_sampling", env="LLAMA_ARG_BACKEND_SAMPLING",
        help="Tandem samples on the CPU"))
    mmproj_auto: bool | None = field(default=None, metadata=flag(
        "--mmproj-auto", off=("--no-mmproj-auto",), env="LLAMA_ARG_MMPROJ_AUTO",
        help="Tandem finds no projector by itself: give --mmproj FILE"))
    mmproj_offload: bool | None = field(default=None, metadata=flag(
        "--mmproj-offload", off=("--no-mmproj-offload",), env="LLAMA_ARG_MMPROJ_OFFLOAD",
        help="Tandem runs the projector on the CPU"))
    image_min_tokens: int | None = field(default=None, metadata=flag(
        "--image-min-tokens", type=int, help="Gemma 3's images take a fixed number of tokens"))
    image_max_tokens: int | None = field(default=None, metadata=flag(
        "--image-max-tokens", type=int, help="Gemma 3's images take a fixed number of tokens"))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                log.info("%s: no effect; %s", _given(f.metadata, value), f.metadata["help"])


def _given(meta: dict, value) -> str:
    """How a command line gives `value`: --swa-full, --no-jinja, --n-gpu-layers 99."""
    longs = [n for n in meta["flags"] if n.startswith("--")]
    if value is False and meta["off"]:
        return meta["off"][0]
    return longs[0] if isinstance(value, bool) else f"{longs[0]} {value}"
