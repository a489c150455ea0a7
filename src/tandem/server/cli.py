"""`tandem serve`: llama-server's flags, a socket that listens at once, models loaded behind it.

    tandem serve --model target.gguf --model-draft draft.gguf --ctx-size 8192 --parallel 1 \\
        --host 127.0.0.1 --port 8080 --spec-type auto --spec-draft-n-max 4

Without --model and --model-draft the default pair is served (target "default", draft
"default-draft", --spec-type auto unless another is given). GET /health answers 503 "Loading model" until the models are
loaded and warmed up, then 200. The log (stderr) says what runs: the spec type, the draft and
its compatibility verdict, the memory plan, and whether speculation is on.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import sys
import threading
import time

from .. import flags
from ..config import SamplingParams
from ..errors import TandemError

log = logging.getLogger("tandem.server")


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_model_args(p, default_model=None, parallel=True)
    flags.add_spec_args(p)
    g = p.add_argument_group("server (llama-server's spelling)")
    g.add_argument("--host", default="127.0.0.1",
                   help="address(es) to listen on, comma-separated (127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    g.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' (default: $TANDEM_API_KEY; none)")
    g.add_argument("-to", "--timeout", type=float, default=600.0,
                   help="seconds a request may take: reading it, waiting and generating (600)")
    g.add_argument("-a", "--alias", default=None,
                   help="model name(s) the API reports, comma-separated; the id is the first in "
                        "alphabetical order, as llama-server's")
    g.add_argument("--queue-size", type=int, default=None,
                   help="requests that may wait for a slot before new ones get 503 "
                        "(default: 4 x --parallel)")
    g.add_argument("--no-warmup", action="store_true",
                   help="skip the short warm-up generation after loading")
    g.add_argument("--slots", dest="slots_endpoint", action="store_true", default=True,
                   help="serve GET /slots (the default)")
    g.add_argument("--no-slots", dest="slots_endpoint", action="store_false",
                   help="turn GET /slots off")
    g.add_argument("--ui", "--webui", dest="ui", action="store_true", default=True,
                   help="serve the web page at / (the default)")
    g.add_argument("--no-ui", "--no-webui", dest="ui", action="store_false",
                   help="turn the web page off (/ answers 404)")
    g.add_argument("-ub", "--ubatch-size", type=int, default=None,
                   help="llama-server's physical batch: Tandem's passes have one size, so the "
                        "smaller of --batch-size and this is the most rows a pass carries")
    g.add_argument("-fa", "--flash-attn", nargs="?", const="on", default=None,
                   choices=("on", "off", "auto"),
                   help="accepted for llama-server command lines; Tandem's attention is its own "
                        "exact kernel either way (said once in the log)")
    g.add_argument("--jinja", dest="jinja", action="store_true", default=True,
                   help="render chats with the model's Jinja template (always on in Tandem)")
    g.add_argument("--no-jinja", dest="jinja", action="store_false",
                   help="accepted; Tandem always renders the model's Jinja template (logged)")
    g.add_argument("--no-context-shift", dest="context_shift", action="store_false",
                   default=False, help="stop a generation when its slot's context is full "
                                       "(the default, as llama-server's)")
    g.add_argument("--context-shift", dest="context_shift", action="store_true",
                   help="when a slot's context is full, drop half of the tokens after the "
                        "request's n_keep (default 0; -1: the prompt) and go on generating; "
                        "the answer is then marked truncated")
    g.add_argument("-v", "--verbose", action="store_true", help="log more (debug)")
    g.add_argument("--offline", action="store_true",
                   help="never download: a model name that is not pulled yet is an error")
    g.add_argument("--metrics", action="store_true",
                   help="serve GET /metrics (Prometheus text, llama-server's llamacpp: series)")
    g.add_argument("-cb", "--cont-batching", dest="cont_batching", action="store_true",
                   default=True, help="accepted: Tandem always batches slots continuously")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers", default=None,
                   help="accepted: Tandem runs on the CPU (said once in the log)")
    g.add_argument("--embedding", "--embeddings", dest="embedding", action="store_true",
                   help="serve embeddings (POST /v1/embeddings, /embedding): the target's "
                        "final hidden states, pooled (--pooling) and normalized")
    g.add_argument("--pooling", default="last", choices=("none", "mean", "cls", "last", "rank"),
                   help="how an embedding pools the hidden states: last (the token that has "
                        "read the whole input; the default for causal models), mean, cls (the "
                        "first token), none (one vector per token, /embedding only), rank "
                        "(a reranker's classification head on the last token: POST /rerank)")
    g.add_argument("--cors-origins", default=None,
                   help="origins a browser may call the API from, comma-separated; "
                        "'localhost' = any port of localhost, 127.0.0.1, [::1]; '*' = any "
                        "(the default; 'localhost' with --tools)")
    g.add_argument("--ui-mcp-proxy", "--webui-mcp-proxy", dest="ui_mcp_proxy",
                   action="store_true", default=False,
                   help="experimental: serve GET/POST /cors-proxy?url=URL, which forwards a "
                        "request for the web page's MCP servers - do not enable in untrusted "
                        "environments (default: off)")
    g.add_argument("--no-ui-mcp-proxy", "--no-webui-mcp-proxy", dest="ui_mcp_proxy",
                   action="store_false", help="turn /cors-proxy off (403; the default)")
    g.add_argument("--tools", metavar="TOOL1,TOOL2,...", default=None,
                   help="experimental: built-in tools for AI agents at GET/POST /tools - do "
                        "not enable in untrusted environments (default: none); 'all' for "
                        "every one of read_file, file_glob_search, grep_search, "
                        "exec_shell_command, write_file, edit_file, get_info; --cors-origins "
                        "then defaults to localhost")
    g.add_argument("--tools-runtime", metavar="OPTION", default=None,
                   help="experimental: where the tools run (default: this machine): "
                        "'docker:<image>', 'podman:<image>' (a container started now, removed "
                        "at exit), 'docker-container:<id>', 'podman-container:<id>' (a running "
                        "one), 'ssh:<target>' (a POSIX host; key auth, trusted host key)")
    g.add_argument("-ag", "--agent", "-no-ag", "--no-agent", action=_Agent, nargs=0,
                   help="--tools all and --ui-mcp-proxy together (--no-agent: neither)")
    g.add_argument("--slot-save-path", default=None,
                   help="folder for slot files: POST /slots/ID?action=save|restore "
                        "{\"filename\"} writes or reads a slot's cache there (off without it)")
    g.add_argument("--mmproj", "-mm", default=None, metavar="FILE",
                   help="the target's multimodal projector (a Gemma 3 mmproj GGUF): images in "
                        "chat image_url parts and /completion's multimodal_data")
    g.add_argument("--mmproj-url", "-mmu", default=None, metavar="URL",
                   help="refused: Tandem downloads nothing; give --mmproj FILE")
    g.add_argument("--no-mmproj", action="store_true",
                   help="no multimodal projector, even with --mmproj")
    for flag in ("--mmproj-auto", "--mmproj-offload"):
        g.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                       help="accepted: no effect (Tandem finds no projector by itself and "
                            "runs it on the CPU)")
    g.add_argument("--media-path", default=None, metavar="DIR",
                   help="a folder images may be read from as file:// URLs (relative paths, "
                        "no '..'); off without it")
    for flag in ("--image-min-tokens", "--image-max-tokens"):
        g.add_argument(flag, type=int, default=None,
                       help="accepted: no effect (Gemma 3's images take a fixed number)")
    g.add_argument("--reranking", "--rerank", dest="reranking", action="store_true",
                   help="serve POST /rerank (--embedding --pooling rank): a reranker GGUF with "
                        "a classification head (cls.output, e.g. Qwen3-Reranker) scores each "
                        "document against the query")
    g.add_argument("--backend-sampling", "--backend_sampling", dest="backend_sampling",
                   action="store_true",
                   help="accepted: Tandem samples on the CPU, where its logits are")
    g.add_argument("--cache-idle-slots", dest="cache_idle_slots",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="with the host prompt cache on (--cache-ram, on by default): when a "
                        "request starts, every idle slot's cached tokens are copied there, and "
                        "with --kv-unified the slot is cleared, its room given to the shared "
                        "context; a prompt that starts the same way later is read back from "
                        "host memory (default on, as llama-server's; --no-cache-idle-slots: an "
                        "idle slot keeps its tokens until its room or the slot is needed)")
    g.add_argument("--swa-full", action="store_true",
                   help="accepted: Tandem's cache always keeps every position of sliding-"
                        "window layers")
    g.add_argument("--chat-template-file", default=None,
                   help="a Jinja chat template file to use instead of the model's")
    g.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (text) to use instead of the model's, or one of "
                        "llama-server's built-in names: chatml, llama3, command-r, gemma, phi3")
    g.add_argument("--reasoning", "-rea", default="auto", choices=("on", "off", "auto"),
                   help="thinking in chat templates that have it (Qwen3, DeepSeek-R1, QwQ, "
                        "Command R7B): on/off set the template's enable_thinking, off also "
                        "closes a thought the template opens; auto leaves the template be")
    g.add_argument("--tags", default=None,
                   help="comma-separated tags GET /v1/models reports for the model")
    g = p.add_argument_group("default sampling (each request's, where it sends none)")
    flags.add_config_args(g, SamplingParams)


class _Agent(argparse.Action):
    """llama-server's --agent: the tools and the proxy on (off with --no-agent), in the
    command line's order with --tools and --ui-mcp-proxy."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        on = option_string in ("-ag", "--agent")
        namespace.tools, namespace.ui_mcp_proxy = ("all" if on else None), on


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop, the error's exit code otherwise."""
    _setup_logging()
    for line in getattr(args, "env_used", ()):  # llama-server's variables (envargs.py)
        log.info("environment: %s", line)
    try:
        settings = _settings(args)
        socks = [_listen(host, args.port) for host in _hosts(args.host)]
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    import uvicorn  # after listening: a client's first /health must not wait for imports

    from .app import create_app
    from .state import ServerState

    state = ServerState(settings)
    if settings.tools:
        from .agent_io import ToolRuntimeError
        from .agent_tools import Toolbox

        try:  # --tools-runtime docker:<image> starts its container now
            state.tools = Toolbox(settings.tools, settings.tools_runtime)
        except (ToolRuntimeError, ValueError) as e:
            print(f"tandem: error: tools setup failed: {e}", file=sys.stderr)
            return 1
    _warn_features(settings)
    config = uvicorn.Config(create_app(state), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    outcome = {"code": 0}
    loader = threading.Thread(target=_load, args=(state, server, outcome),
                              name="tandem-loader", daemon=True)
    for sock in socks:
        host, port = sock.getsockname()[:2]
        log.info("listening on http://%s:%d (models load in the background; /health answers "
                 "503 until they are ready)", f"[{host}]" if ":" in host else host, port)
    if settings.ui:
        host, port = socks[0].getsockname()[:2]
        log.info("the web page: http://%s:%d/ (--no-ui turns it off)",
                 "127.0.0.1" if host in ("0.0.0.0", "::") else
                 f"[{host}]" if ":" in host else host, port)
    loader.start()
    try:
        server.run(sockets=socks)
    finally:
        # the container --tools-runtime started is removed first: it does not wait on the
        # engine, whose thread may take a while to stop (a step under way; a busy machine)
        if state.tools is not None:
            state.tools.close()
        if state.worker is not None:
            state.worker.stop()
    return outcome["code"]


def _warn_features(s) -> None:
    features = [name for name, on in (("MCP proxy (experimental)", s.ui_mcp_proxy),
                                      ("server tools (experimental)", bool(s.tools)),
                                      ("tools runtime (experimental)",
                                       bool(s.tools and s.tools_runtime))) if on]
    if features:
        log.warning("security: %s enabled - do not expose to untrusted environments",
                    ", ".join(features))


def _setup_logging() -> None:
    for name in ("tandem.server", "tandem.engine"):  # the engine's: threads per pass changed
        logger = logging.getLogger(name)
        if not logger.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter("tandem: %(message)s"))
            logger.addHandler(h)
            logger.setLevel(logging.INFO)
            logger.propagate = False


def _settings(a: argparse.Namespace):
    """Check every flag before listening, so a typo fails at once, not after loading. Resolves
    the models: no --model and no --model-draft is the default pair; a draft the spec type does
    not use is not loaded (flags.spec_config warns once)."""
    from ..config import SpecConfig
    from .state import ServerSettings

    if a.model is None and a.model_draft is None:  # the default pair
        a.model = "default"
        if SpecConfig(types=a.spec_types).resolved(has_draft=True).uses_draft:
            a.model_draft = "default-draft"
    elif a.model is None:
        a.model = "default"
    spec = flags.spec_config(a)
    if not spec.uses_draft:
        a.model_draft = None
    engine = flags.engine_config(a)
    for flag, name in (("--model", a.model), ("--model-draft", a.model_draft)):
        _check_exists(flag, name, a.offline)
    if not 0 <= a.port <= 65535:
        raise TandemError(f"--port must be 0..65535, got {a.port}")
    if not a.timeout > 0:
        raise TandemError(f"--timeout must be > 0 seconds, got {a.timeout:g}")
    queue = 4 * a.n_parallel if a.queue_size is None else a.queue_size
    if queue < 0:
        raise TandemError(f"--queue-size must be >= 0, got {queue}")
    if a.ubatch_size is not None:
        if a.ubatch_size < 2:
            raise TandemError(f"--ubatch-size must be >= 2, got {a.ubatch_size}")
        engine = dataclasses.replace(engine, batch_size=min(engine.batch_size, a.ubatch_size))
    if a.context_shift:
        engine = dataclasses.replace(engine, context_shift=True)
    if a.flash_attn is not None:
        log.info("--flash-attn %s: no effect; Tandem's attention is its own exact kernel",
                 a.flash_attn)
    if not a.jinja:
        log.info("--no-jinja: no effect; Tandem always renders the model's Jinja template")
    if a.reranking:  # as llama-server: embeddings on, pooled by the ranking head
        a.embedding, a.pooling = True, "rank"
    if a.backend_sampling:
        log.info("--backend-sampling: no effect; Tandem samples on the CPU")
    idle = a.cache_idle_slots is not False
    if idle and engine.cache_ram == 0:
        if a.cache_idle_slots:
            log.warning("--cache-idle-slots requires --cache-ram, disabling")
        idle = False
    engine = dataclasses.replace(engine, cache_idle_slots=idle)
    if a.swa_full:
        log.info("--swa-full: no effect; Tandem's cache keeps every position of every layer")
    if a.slot_save_path is not None and not os.path.isdir(a.slot_save_path):
        raise TandemError(f"--slot-save-path {a.slot_save_path}: no such folder")
    if a.mmproj_url is not None:
        raise TandemError(f"--mmproj-url {a.mmproj_url}: Tandem downloads nothing; download "
                          "the file and give --mmproj FILE")
    for flag in ("mmproj_auto", "mmproj_offload", "image_min_tokens", "image_max_tokens"):
        if getattr(a, flag) is not None:
            log.info("--%s: no effect", flag.replace("_", "-"))
    mmproj = None if a.no_mmproj else a.mmproj
    if mmproj is not None and not os.path.isfile(mmproj):
        raise TandemError(f"--mmproj {mmproj}: no such file")
    if a.media_path is not None and not os.path.isdir(a.media_path):
        raise TandemError(f"--media-path {a.media_path}: no such folder")
    chat_template = _chat_template(a)
    if a.n_gpu_layers is not None:
        log.info("--n-gpu-layers %s: no effect; Tandem runs on the CPU", a.n_gpu_layers)
    if a.verbose:
        for name in ("tandem.server", "tandem.engine"):
            logging.getLogger(name).setLevel(logging.DEBUG)
        if idle:  # (the marker is llama-server's, which its test suite reads)
            log.debug("idle slots will be saved to the prompt cache%s upon starting a new "
                      "task __TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__",
                      " and cleared" if engine.kv_unified else "")
    tools = [t.strip() for t in (a.tools or "").split(",") if t.strip()]
    cors = a.cors_origins
    if cors is None:
        cors = "localhost" if tools else "*"
        if tools:
            log.warning("server tools are enabled, using localhost as default CORS origin "
                        "(change via --cors-origins)")
    if tools:
        from .agent_io import ToolRuntimeError, check_tools

        try:
            check_tools(tools, a.tools_runtime)
        except (ToolRuntimeError, ValueError) as e:
            raise TandemError(f"tools setup failed: {e}") from None
    elif a.tools_runtime:
        log.info("--tools-runtime %s: no effect without --tools", a.tools_runtime)
    sampling = flags.config_of(SamplingParams, a)
    return ServerSettings(model=a.model, model_draft=a.model_draft, engine=engine, spec=spec,
                          warmup=not a.no_warmup, alias=a.alias, api_key=a.api_key,
                          timeout=a.timeout, max_queue=queue, sampling=sampling,
                          slots_endpoint=a.slots_endpoint, ui=a.ui,
                          tags=[t for t in (a.tags or "").split(",") if t], verbose=a.verbose,
                          metrics_endpoint=a.metrics, embeddings=a.embedding,
                          pooling=a.pooling,
                          cors_origins=[o.strip() for o in cors.split(",") if o.strip()],
                          slot_save_path=a.slot_save_path, chat_template=chat_template,
                          mmproj=mmproj, media_path=a.media_path,
                          reasoning=a.reasoning, tools=tools,
                          tools_runtime=a.tools_runtime if tools else None,
                          ui_mcp_proxy=a.ui_mcp_proxy)


def _chat_template(a: argparse.Namespace) -> str | None:
    """--chat-template-file's text, or --chat-template's (a template, or the name chatml)."""
    from ..tokenizer import BUILTIN_TEMPLATES

    if a.chat_template_file is not None and a.chat_template is not None:
        raise TandemError("give --chat-template or --chat-template-file, not both")
    if a.chat_template_file is not None:
        try:
            return open(a.chat_template_file, encoding="utf-8").read()
        except OSError as e:
            raise TandemError(f"--chat-template-file {a.chat_template_file}: "
                              f"{e.strerror or e}") from None
    t = a.chat_template
    if t is None:
        return None
    if t in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[t]
    if "{%" not in t and "{{" not in t:
        raise TandemError(f"--chat-template {t!r}: not a Jinja template, and of llama-server's "
                          f"built-in names Tandem knows {', '.join(BUILTIN_TEMPLATES)}; pass "
                          "the template's text or --chat-template-file")
    return t


def _check_exists(flag: str, name: str | None, offline: bool = False) -> None:
    """A path that is not there fails now; a model name is pulled (if needed) when loading,
    unless --offline."""
    from pathlib import Path

    from ..errors import ModelFileError
    from ..registry import MODELS, is_pulled

    if offline and name in MODELS and not is_pulled(name):
        raise ModelFileError(f"{flag} {name}: not pulled yet and --offline forbids downloading "
                             f"it (run `tandem models pull {name}` first)")
    if name is not None and name not in MODELS and not Path(name).exists():
        raise ModelFileError(f"{flag} {name}: no such file or directory (give a .gguf file, a "
                             f"Hugging Face directory, or a model name: {', '.join(MODELS)})")


def _hosts(spec: str) -> list[str]:
    """--host: one address or several, comma-separated (llama-server's spelling), each
    possibly in [brackets] for IPv6."""
    hosts = [h.strip().removeprefix("[").removesuffix("]") for h in spec.split(",")]
    if not all(hosts):
        raise TandemError(f"--host {spec!r}: an empty address in the list")
    return hosts


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        raise TandemError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another "
                          "--port or --host") from None


def _load(state, server, outcome: dict) -> None:
    """The loader thread: plan, load, check, warm up, then start the worker."""
    try:
        _load_models(state)
        state.status = "ready"
        engine = state.engine
        log.info("ready: %d slot(s) of %d tokens, queue of %d; speculation %s",
                 engine.cfg.n_parallel, engine.cfg.ctx_size, state.settings.max_queue,
                 "ON" if engine.spec.enabled else "OFF")
    except TandemError as e:
        _fail(state, server, outcome, f"error: {e}", e.exit_code)
    except Exception as e:  # a bug or an unexpected failure while loading
        log.exception("loading failed")
        _fail(state, server, outcome, f"error: loading failed: {type(e).__name__}: {e}", 1)


def _fail(state, server, outcome: dict, message: str, code: int) -> None:
    log.error(message)
    state.status = "error"
    outcome["code"] = code
    server.should_exit = True


def _load_models(state) -> None:
    from ..check import memory_plan
    from ..speculative.compat import check_compatible
    from .worker import Worker

    s = state.settings
    spec, cfg = s.spec, s.engine
    log.info("spec type: %s; target: %s; draft: %s", ",".join(spec.types), s.model,
             s.model_draft or "none")
    mem = memory_plan(cfg, spec, s.model, s.model_draft, embeddings=s.embeddings,
                      mmproj=s.mmproj)
    for line in mem.format().splitlines():
        log.info("%s", line)
    if not mem.fits:
        raise TandemError("the memory plan does not fit: lower --ctx-size or --parallel, or "
                          "use a smaller model")
    engine = flags.load_engine(s.model, s.model_draft, cfg, spec, log=log.info)
    if s.mmproj is not None:  # the target's image encoder
        from ..models.vision import load_mmproj

        engine.vision = load_mmproj(s.mmproj)
        engine.vision.check_text_model(engine.target.args)
        if engine.cfg.context_shift:  # as llama-server: an image cannot be cut and moved
            engine.cfg = dataclasses.replace(engine.cfg, context_shift=False)
            log.warning("--context-shift is not supported with --mmproj; it is disabled")
        log.info("mmproj %s: images of %d tokens%s", s.mmproj, engine.vision.tokens_per_image,
                 "; the draft model is not used for prompts with images"
                 if engine.draft is not None else "")
    if engine.draft is not None:
        verdict = check_compatible(engine.target.tokenizer, engine.draft.tokenizer)
        log.info("draft %s: %s", engine.draft.path, verdict.message)
    log.info(spec.describe(None if engine.draft is None else engine.draft.path.name))
    if s.embeddings and s.pooling == "rank":
        head = engine.target.rank_head
        if head is None:
            raise TandemError(f"--reranking (--pooling rank): {engine.target.path} has no "
                              "classification head (tensor cls.output.weight); use a reranker "
                              "GGUF such as Qwen3-Reranker converted by llama.cpp")
        log.info("reranking: %d-label head (%s)%s", head.weight.shape[0],
                 ", ".join(head.labels) or "unnamed labels",
                 ", the file's rerank prompt" if head.template else "")
    from .. import kernels

    if kernels.available():
        log.info("kernels: the %s build (the same bits in every build)", kernels.in_use())
    if s.warmup:
        _warm_up(engine)
    state.model_path = str(engine.target.path)
    state.draft_path = None if engine.draft is None else str(engine.draft.path)
    if s.chat_template is not None:  # --chat-template(-file) replaces the model's
        engine.tok.chat_template = s.chat_template
        engine.tok.apply_chat_template([{"role": "user", "content": "hi"}])  # fails now if bad
    state.engine = engine
    state.created = int(time.time())
    worker = Worker(engine, state.metrics, state.settings.max_queue)
    worker.start()
    state.worker = worker


def _warm_up(engine) -> None:
    """One short greedy generation: runs every code path once and shows speculation at work;
    what it leaves in the cache is erased."""
    from ..config import SamplingParams
    from ..engine import Request

    ids = engine.tok.encode("Hello, world! Hello, world! Hello,", add_special=True,
                            parse_special=True)
    t0 = time.perf_counter()
    seq = engine.generate(Request(ids, SamplingParams(temperature=0.0, n_predict=8),
                                  cache_prompt=False))
    engine.erase_slot(seq.slot)  # as llama-server clears its cache: no request reuses it
    line = f"warm-up: {len(seq.output)} tokens in {1e3 * (time.perf_counter() - t0):.0f} ms"
    if seq.spec.enabled:
        st = seq.stats
        line += (f"; {st.n_drafts} draft(s), {st.n_accepted}/{st.n_drafted} drafted tokens "
                 "accepted")
    log.info(line)
