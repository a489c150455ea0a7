"""`tandem serve`: parse llama-server's flags, build the settings (settings.py), listen at
once, load the models behind the socket, run.

    tandem serve --model target.gguf --model-draft draft.gguf --ctx-size 8192 --parallel 1 \\
        --host 127.0.0.1 --port 8080 --spec-type auto --spec-draft-n-max 4

Without --model and --model-draft the default pair is served (target "default", draft
"default-draft", --spec-type auto unless another is given). GET /health answers 503 "Loading
model" until the models are loaded and warmed up, then 200. The log (stderr) says what runs:
the spec type, the draft and its compatibility verdict, the memory plan, and whether
speculation is on.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import socket
import sys
import threading
import time

from .. import flags
from ..config import SamplingParams, SpecConfig
from ..errors import TandemError
from .router.settings import RouterSettings
from .settings import IgnoredFlags, ServerSettings

log = logging.getLogger("tandem.server")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag from its setting's field: the models and the engine, speculation, the
    server, llama-server's flags that have no effect here, the default sampling."""
    flags.add_model_args(p, default_model=None, parallel=True)
    flags.add_spec_args(p)
    flags.add_config_args(p.add_argument_group("server (llama-server's spelling)"),
                          ServerSettings)
    flags.add_config_args(p.add_argument_group(
        "router mode: many models, one child server each (no --model)"), RouterSettings)
    from ..cluster.settings import FleetSettings  # (no Ray import: --replicas loads it)

    flags.add_config_args(p.add_argument_group(
        "replicas on Ray Serve (pip install 'tandem[cluster]'; docs/cluster.md)"), FleetSettings)
    flags.add_config_args(p.add_argument_group(
        "accepted for llama-server's command lines, no effect (said once in the log, why)"),
        IgnoredFlags)
    flags.add_config_args(p.add_argument_group(
        "default sampling (each request's, where it sends none)"), SamplingParams)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop, the error's exit code otherwise."""
    _setup_logging()
    for line in getattr(args, "env_used", ()):  # llama-server's variables (envargs.py)
        log.info("environment: %s", line)
    if getattr(args, "hf_repo", None):  # downloaded: a preset (router mode) or the model
        from .router.main import from_hub

        try:
            from_hub(args)
        except TandemError as e:
            print(f"tandem: error: {e}", file=sys.stderr)
            return e.exit_code
    if getattr(args, "models_dir", None) or getattr(args, "models_preset", None):
        from .router.main import run as run_router  # router mode (router/)

        return run_router(args, add_arguments, _settings,
                          lambda s: [_listen(h, s.port) for h in _hosts(s.host)])
    try:
        settings = _settings(args)
        if getattr(args, "replicas", None) is not None or getattr(args, "ray", "local") != "local":
            return _serve_fleet(args, settings)
        socks = [_listen(host, settings.port) for host in _hosts(settings.host)]
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    import uvicorn  # after listening: a client's first /health must not wait for imports

    from .app import create_app
    from .state import ServerState

    state = ServerState(settings)
    if settings.sleep_idle_seconds > 0:
        from .sleep import Sleeper

        state.sleeper = Sleeper(state, settings.sleep_idle_seconds, lambda: _start(state))
        state.sleeper.start()
    if settings.tools:
        from ..agent.runtime import ToolRuntimeError
        from ..agent.tools import Toolbox

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
        if state.sleeper is not None:
            state.sleeper.close()
        if state.tools is not None:
            state.tools.close()
        if state.worker is not None:
            state.worker.stop()
    return outcome["code"]


def _serve_fleet(args: argparse.Namespace, settings: ServerSettings) -> int:
    """--replicas N: the same server as N engine replicas on Ray Serve (cluster/)."""
    from ..cluster.launch import serve
    from ..cluster.settings import FleetSettings

    return serve(settings, flags.config_of(FleetSettings, args), _load_models)


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


def _settings(a: argparse.Namespace) -> ServerSettings:
    """The settings from parsed flags, every one checked before listening, so a typo fails at
    once, not after loading. Resolves the models: no --model and no --model-draft is the
    default pair; a draft the spec type does not use is not loaded (flags.spec_config warns
    once)."""
    if a.model is None and a.model_draft is None:  # the default pair
        a.model = "default"
        types = SpecConfig(types=a.spec_types)
        if "draft-eagle3" not in (types.types or ()) and types.resolved(True).uses_draft:
            a.model_draft = "default-draft"
    elif a.model is None:
        a.model = "default"
    spec = flags.spec_config(a)
    if not spec.uses_draft:
        a.model_draft = None
    engine = flags.engine_config(a)
    for flag, name in (("--model", a.model), ("--model-draft", a.model_draft)):
        _check_exists(flag, name, a.offline)
    if "draft-eagle3" in spec.types:  # a head that does not fit the target: before listening
        from ..check import inspect_head, inspect_model

        inspect_head(a.model_draft, inspect_model("target", a.model))
    settings = flags.config_of(ServerSettings, a, model=a.model, model_draft=a.model_draft,
                               engine=engine, spec=spec, sampling=flags.sampling_params(a))
    flags.config_of(IgnoredFlags, a)  # says why each one given has no effect
    if settings.verbose:
        for name in ("tandem.server", "tandem.engine"):
            logging.getLogger(name).setLevel(logging.DEBUG)
        if settings.cache_idle_slots:  # (the marker is llama-server's; its test suite reads it)
            log.debug("idle slots will be saved to the prompt cache%s upon starting a new "
                      "task __TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__",
                      " and cleared" if engine.kv_unified else "")
    if settings.tools or settings.ui_mcp_proxy:
        _check_agent(settings)
    return settings


def _check_agent(settings: ServerSettings) -> None:
    """The agent extra is installed, and --tools names tools it has, in a runtime it knows."""
    try:
        from ..agent import proxy, tools  # noqa: F401 (they import httpx and wcmatch)
        from ..agent.runtime import ToolRuntimeError, check_tools
    except ImportError as e:
        raise TandemError(f"--tools, --ui-mcp-proxy and --agent need the agent extra, which is "
                          f"not installed ({e}): pip install 'tandem[agent]'") from None
    if settings.tools:
        try:
            check_tools(settings.tools, settings.tools_runtime)
        except (ToolRuntimeError, ValueError) as e:
            raise TandemError(f"tools setup failed: {e}") from None


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
        if state.sleeper is not None:
            state.sleeper.loaded()
            log.info("the model sleeps after %d s idle (--sleep-idle-seconds)",
                     state.sleeper.seconds)
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
    """The memory plan (said, then checked), then the models (`_start`)."""
    from ..check import memory_plan
    from ..memory import fmt_bytes, resident

    s = state.settings
    spec, cfg = s.spec, s.engine
    log.info("spec type: %s; target: %s; draft: %s", ",".join(spec.types), s.model,
             s.model_draft or "none")
    mem = memory_plan(cfg, spec, s.model, s.model_draft, embeddings=s.embeddings,
                      mmproj=s.mmproj)
    for line in mem.format().splitlines():
        log.info("%s", line)
    state.memory_plan = mem
    log.info("memory before loading: %s resident (the plan's runtime line: %s)",
             fmt_bytes(resident().get("resident", 0)), fmt_bytes(mem.runtime))
    if not mem.fits:
        raise TandemError(f"the memory plan does not fit: it needs {fmt_bytes(mem.total)}, "
                          f"{fmt_bytes(mem.available)} is available ({mem.available_source}); "
                          "lower --ctx-size or --parallel, or use a smaller model")
    _start(state)


def _start(state) -> None:
    """Load the models, check them, warm up, start the worker: at startup, and again on
    waking from --sleep-idle-seconds (sleep.py)."""
    from ..speculative.compat import check_compatible
    from .worker import Worker

    s = state.settings
    spec, cfg = s.spec, s.engine
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
    drafter = engine.draft or engine.head
    log.info(spec.describe(None if drafter is None else drafter.path.name))
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
    state.draft_path = None if drafter is None else str(drafter.path)
    if s.chat_template is not None:  # --chat-template(-file) replaces the model's
        engine.tok.chat_template = s.chat_template
        engine.tok.apply_chat_template([{"role": "user", "content": "hi"}])  # fails now if bad
    state.engine = engine
    state.created = state.created or int(time.time())  # the first load's, kept across sleeps
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
