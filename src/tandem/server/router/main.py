"""`tandem serve --models-dir DIR | --models-preset FILE` with no --model: the router.

At start, before listening: the catalog is read (a preset key Tandem does not know, a folder
that is not there: exit 2 naming it), and every model's command line is parsed as its child
will parse it (a bad value in a preset fails now, naming the model). Then the router listens,
starts the models marked load-on-startup, and serves until SIGINT/SIGTERM, when every child is
stopped.

`server/cli.py` hands in its parser builder and its settings function (the router is below it:
no import goes back up).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Callable

from ... import flags
from ...config import SpecConfig
from ...errors import TandemError
from ..settings import ServerSettings
from .catalog import Catalog
from .children import common_args
from .settings import RouterSettings

log = logging.getLogger("tandem.server")


class _Strict(flags.Parser):
    """`tandem serve`'s parser, whose errors are raised (a child's command line checked)."""

    def error(self, message: str) -> None:
        raise TandemError(message)


def run(args: argparse.Namespace, add_arguments: Callable, settings_of: Callable,
        listen: Callable) -> int:
    try:
        router, settings, models = _prepare(args, add_arguments, settings_of)
        socks = listen(settings)
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    import uvicorn

    from .app import create_router_app

    state = argparse.Namespace(settings=settings)
    app = create_router_app(state, models, router.models_autoload)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           lifespan="on", timeout_graceful_shutdown=3))
    models.closing = lambda: server.should_exit
    for sock in socks:
        host, port = sock.getsockname()[:2]
        log.info("router listening on http://%s:%d: %d model(s), at most %s loaded, autoload "
                 "%s", host, port, len(models.instances), router.models_max or "any number",
                 "on" if router.models_autoload else "off")

    @app.on_event("startup")
    async def _startup():
        for inst in models.instances.values():
            if inst.entry.load_on_startup:  # (a preset's model not in the cache: fetched first)
                asyncio.create_task(app.state.downloads.load_later(
                    inst, lambda name=inst.entry.id: models.load(name)))

    @app.on_event("shutdown")
    async def _shutdown():
        app.state.downloads.close()  # (a download's thread would keep the process alive)
        await models.close()

    server.run(sockets=socks)
    return 0


def from_hub(args: argparse.Namespace) -> None:
    """-hf USER/MODEL[:QUANT] (llama-server's): downloaded (with --offline, found in the cache);
    a preset repo becomes --models-preset (router mode), a model repo --model and --mmproj."""
    import threading

    from . import hfcache, hub

    name = args.hf_repo
    if args.model is not None:
        raise TandemError(f"-hf {name} and --model {args.model} both name the model: give one")
    if args.offline:
        preset, model, mmproj = _from_cache(name)
    else:
        try:
            plan = hub.plan(name)
        except hub.HubError as e:
            raise TandemError(f"-hf: {e}") from None
        log.info("-hf %s: %s from %s into %s", name, ", ".join(plan.files), hub.endpoint(),
                 hfcache.cache_dir())
        try:
            first = hub.fetch(plan, _said_every_tenth(), threading.Event())
        except Exception as e:  # the hub's, the network's, the disk's
            raise TandemError(f"-hf {name}: the download failed: {type(e).__name__}: "
                              f"{hub.first_line(e)}") from None
        snap = hfcache.repo_dir(plan.repo) / "snapshots" / plan.commit
        preset = str(first) if plan.preset else None
        model = None if plan.preset else str(first)
        mmproj = str(snap / plan.files[-1]) if len(plan.files) > 1 and \
            "mmproj" in plan.files[-1] else None
    if preset is not None:
        if args.models_preset:
            raise TandemError(f"-hf {name} is a preset repo, and --models-preset "
                              f"{args.models_preset} is another preset: give one")
        args.models_preset = preset
        return
    if args.models_dir or args.models_preset:
        raise TandemError(f"-hf {name} names a model, and --models-dir / --models-preset start "
                          "a router, whose models are in the folder or the preset: drop one")
    args.model = model
    if mmproj and not args.mmproj and not getattr(args, "no_mmproj", False):
        args.mmproj = mmproj


def _said_every_tenth() -> Callable[[str, int, "int | None"], None]:
    """-hf's download progress in the log: each file at every tenth of it."""
    said: dict[str, int] = {}

    def progress(url: str, done: int, total: int | None) -> None:
        tenth = done * 10 // total if total else 0
        if said.get(url, -1) < tenth:
            said[url] = tenth
            log.info("-hf: %s: %d%% of %.1f MB", url.rsplit("/", 1)[-1], tenth * 10,
                     (total or 0) / 1e6)
    return progress


def _from_cache(name: str) -> tuple[str | None, str | None, str | None]:
    """-hf with --offline: (the preset, the model, its projector) of the cache."""
    from . import hfcache, hub

    repo, _ = hub.split_name(name)
    snap = hfcache.snapshot(hfcache.repo_dir(repo))
    if snap is not None and (snap / hub.PRESET).is_file():
        return str(snap / hub.PRESET), None, None
    found = hfcache.find(name, hfcache.cached_models())
    if found is None:
        raise TandemError(f"-hf {name}: not in the cache ({hfcache.cache_dir()}), and "
                          "--offline forbids downloading it")
    return None, str(found.path), None if found.mmproj is None else str(found.mmproj)


def _prepare(args: argparse.Namespace, add_arguments: Callable, settings_of: Callable):
    router = flags.config_of(RouterSettings, args)
    if args.model is not None:
        raise TandemError("--models-dir / --models-preset start a router, which has no --model "
                          "of its own: give the models in the folder or the preset, or drop "
                          "those flags to serve one model")
    for flag, given in (("--model-draft", args.model_draft), ("--mmproj", args.mmproj)):
        if given:  # a model's own file: per model, in the preset
            raise TandemError(f"{flag} with --models-dir / --models-preset: a router's models "
                              f"each have their own; give it in the preset's section for the "
                              f"model ({flag.lstrip('-')} = PATH), or POST /models/load "
                              '{"model", "draft"} for a draft')
    parser = _Strict(prog="tandem serve")
    add_arguments(parser)
    catalog = Catalog(router.models_dir, router.models_preset, parser, offline=args.offline)
    common = common_args(list(args.argv[2:]), parser)
    settings = flags.config_of(ServerSettings, args, model="router", model_draft=None,
                               engine=flags.engine_config(args),
                               spec=SpecConfig(types=["none"]),
                               sampling=flags.sampling_params(args))

    def plan_of(argv: list[str]):
        """A child's command line -> its memory plan, as `tandem serve` computes it."""
        from ...check import memory_plan

        s = settings_of(parser.parse_args(argv))
        return memory_plan(s.engine, s.spec, s.model, s.model_draft, embeddings=s.embeddings,
                           mmproj=s.mmproj)

    from .children import child_argv
    from .models import Models

    for e in catalog.entries(hidden=True):  # each child's flags parsed now, as the child will
        argv = child_argv(e, common, 0, e.draft)[4:]
        try:
            parser.parse_args(argv)
        except TandemError as err:
            raise TandemError(f"model {e.id} ({e.source}): {err}") from None
    log.info("router: %d model(s): %s", len(catalog.entries()),
             ", ".join(e.id for e in catalog.entries()) or "none")
    return router, settings, Models(catalog, common, router.models_max, plan_of)

