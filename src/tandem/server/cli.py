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
import logging
import os
import socket
import sys
import threading
import time

from ..errors import TandemError

log = logging.getLogger("tandem.server")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli import add_model_args, add_spec_args

    add_model_args(p, default_model=None)
    add_spec_args(p)
    g = p.add_argument_group("server (llama-server's spelling)")
    g.add_argument("-np", "--parallel", type=int, default=1,
                   help="slots: requests generated at once, batched in one forward pass (1)")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    g.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' (default: $TANDEM_API_KEY; none)")
    g.add_argument("-to", "--timeout", type=float, default=600.0,
                   help="seconds a request may take: reading it, waiting and generating (600)")
    g.add_argument("-a", "--alias", default=None, help="model name the API reports")
    g.add_argument("--queue-size", type=int, default=None,
                   help="requests that may wait for a slot before new ones get 503 "
                        "(default: 4 x --parallel)")
    g.add_argument("--no-warmup", action="store_true",
                   help="skip the short warm-up generation after loading")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tandem serve", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 on a clean stop, the error's exit code otherwise."""
    _setup_logging()
    try:
        settings = _settings(args)
        sock = _listen(args.host, args.port)
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    import prometheus_client
    import uvicorn  # after listening: a client's first /health must not wait for imports

    prometheus_client.disable_created_metrics()  # llama-server has no *_created series

    from .app import create_app
    from .state import ServerState

    state = ServerState(settings)
    config = uvicorn.Config(create_app(state), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    outcome = {"code": 0}
    loader = threading.Thread(target=_load, args=(args, state, server, outcome),
                              name="tandem-loader", daemon=True)
    host, port = sock.getsockname()[:2]
    log.info("listening on http://%s:%d (models load in the background; /health answers 503 "
             "until they are ready)", host, port)
    loader.start()
    try:
        server.run(sockets=[sock])
    finally:
        if state.worker is not None:
            state.worker.stop()
    return outcome["code"]


def _setup_logging() -> None:
    logger = logging.getLogger("tandem.server")
    if not logger.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("tandem: %(message)s"))
        logger.addHandler(h)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _settings(a: argparse.Namespace):
    """Check every flag before listening, so a typo fails at once, not after loading."""
    from ..cli import engine_config, spec_config
    from ..config import SpecConfig
    from .state import ServerSettings

    if a.model is None and a.model_draft is None:  # the default pair
        a.model = "default"
        if a.spec_type is None or {"draft-simple", "auto"} & set(
                SpecConfig.parse_types(a.spec_type)):
            a.model_draft = "default-draft"
    elif a.model is None:
        a.model = "default"
    if "draft-simple" not in spec_config(a).types:
        a.model_draft = None  # warned about once; not loaded
    engine_config(a, a.parallel)
    for flag, name in (("--model", a.model), ("--model-draft", a.model_draft)):
        _check_exists(flag, name)
    if not 0 <= a.port <= 65535:
        raise TandemError(f"--port must be 0..65535, got {a.port}")
    if not a.timeout > 0:
        raise TandemError(f"--timeout must be > 0 seconds, got {a.timeout:g}")
    queue = 4 * a.parallel if a.queue_size is None else a.queue_size
    if queue < 0:
        raise TandemError(f"--queue-size must be >= 0, got {queue}")
    return ServerSettings(model=a.model, model_draft=a.model_draft, alias=a.alias,
                          api_key=a.api_key, timeout=a.timeout, max_queue=queue)


def _check_exists(flag: str, name: str | None) -> None:
    """A path that is not there fails now; a model name is pulled (if needed) when loading."""
    from pathlib import Path

    from ..errors import ModelFileError
    from ..registry import MODELS

    if name is not None and name not in MODELS and not Path(name).exists():
        raise ModelFileError(f"{flag} {name}: no such file or directory (give a .gguf file, a "
                             f"Hugging Face directory, or a model name: {', '.join(MODELS)})")


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        raise TandemError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another "
                          "--port or --host") from None


def _load(args: argparse.Namespace, state, server, outcome: dict) -> None:
    """The loader thread: plan, load, check, warm up, then start the worker."""
    try:
        _load_models(args, state)
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


def _load_models(args: argparse.Namespace, state) -> None:
    from ..cli import load_engine, spec_config
    from ..spec.compat import check_compatible
    from .worker import Worker

    spec = spec_config(args)
    uses_draft = "draft-simple" in spec.types
    log.info("spec type: %s; target: %s; draft: %s", ",".join(spec.types), args.model,
             args.model_draft if uses_draft else "none")
    _check_memory(args, spec, uses_draft)
    engine = load_engine(args, args.parallel, log=log.info)
    if engine.draft is not None:
        verdict = check_compatible(engine.target.tokenizer, engine.draft.tokenizer)
        log.info("draft %s: %s", engine.draft.path, verdict.message)
    log.info(_spec_line(engine))
    if not args.no_warmup:
        _warm_up(engine)
    state.model_path = str(engine.target.path)
    state.draft_path = None if engine.draft is None else str(engine.draft.path)
    state.engine = engine
    state.created = int(time.time())
    worker = Worker(engine, state.metrics, state.settings.max_queue)
    worker.start()
    state.worker = worker


def _check_memory(args: argparse.Namespace, spec, uses_draft: bool) -> None:
    from ..check import inspect_model
    from ..cli import engine_config
    from ..memory import plan

    cfg = engine_config(args, args.parallel)
    models = [inspect_model("target", args.model).spec]
    if uses_draft:
        models.append(inspect_model("draft", args.model_draft).spec)
    # the engine keeps room for max(16, the largest draft) positions beyond the context
    mem = plan(models, cfg.ctx_size, cfg.n_parallel, spec.spare_positions, args.weights,
               cfg.dtype, prefill_chunk=cfg.prefill_chunk, device=cfg.device)
    for line in mem.format().splitlines():
        log.info("%s", line)
    if not mem.fits:
        raise TandemError("the memory plan does not fit: lower --ctx-size or --parallel, or "
                          "use a smaller model")


def _spec_line(engine) -> str:
    s = engine.spec
    if not s.enabled:
        return "speculation: OFF (--spec-type none): the target decodes one token per step"
    parts = []
    for t in s.types:  # in the order they are tried
        if t == "draft-simple":
            parts.append(f"draft-simple with {engine.draft.path.name} (n_max {s.n_max}, "
                         f"n_min {s.n_min}, p_min {s.p_min}"
                         + (f", prompt window {s.draft_window}" if s.draft_window else "")
                         + (f", vocabulary {s.draft_vocab} + used ids" if s.draft_vocab else "")
                         + ")")
        elif t == "ngram-simple":
            parts.append(f"ngram-simple (n-gram {s.ngram_min}..{s.ngram_max}, up to "
                         f"{s.ngram_m} tokens)")
    line = "speculation: ON: " + ", then ".join(parts)
    if s.adaptive:
        line += "; auto: k chosen per step from measured costs, 0 when it does not pay"
    return line


def _warm_up(engine) -> None:
    """One short greedy generation: runs every code path once and shows speculation at work."""
    from ..config import SamplingParams
    from ..engine import Request

    ids = engine.tok.encode("Hello, world! Hello, world! Hello,", add_special=True,
                            parse_special=True)
    t0 = time.perf_counter()
    seq = engine.generate(Request(ids, SamplingParams(temperature=0.0, n_predict=8),
                                  cache_prompt=False))
    line = f"warm-up: {len(seq.output)} tokens in {1e3 * (time.perf_counter() - t0):.0f} ms"
    if seq.spec.enabled:
        st = seq.stats
        line += (f"; {st.n_drafts} draft(s), {st.n_accepted}/{st.n_drafted} drafted tokens "
                 "accepted")
    log.info(line)
