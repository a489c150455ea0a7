"""`tandem serve --replicas N`: Ray started (on 127.0.0.1) or joined, the fleet checked against
the cluster's CPUs, the application deployed (the ingress, N engine replicas behind the
prefix router, the board), served until SIGINT / SIGTERM, then everything this command
started stopped.

    tandem serve -m model.gguf --replicas 2 --threads 1 --port 8080       a local Ray instance
    ray start --head --node-ip-address 127.0.0.1 --num-cpus 8             (once, elsewhere)
    tandem serve -m model.gguf --replicas 4 --threads 2 --ray auto        joins it

Bad input (--replicas 0, a --ray address where nothing answers, more CPUs than the cluster
has free) is one line and exit 2, with nothing left running.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import time
from pathlib import Path

from ..errors import TandemError
from .settings import INSTALL, FleetSettings, router_choice

log = logging.getLogger("tandem.server")
APP, ENGINES = "tandem", "tandem-engines"  # the ingress's application, the replicas'
ANSWER_S = 3.0  # how long a --ray host:port has to accept a connection


def serve(settings, fleet: FleetSettings, load) -> int:
    """Serve the fleet until a signal; `load(state)` loads one replica's models
    (server/cli.py's). Raises TandemError for what the user must change."""
    _check(settings)
    router_choice()  # a bad TANDEM_FLEET_ROUTER said before anything starts
    _check_models(settings)
    if _loopback(fleet.ray):  # every Ray server on 127.0.0.1, advertised as such
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # (read when ray is imported)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no report leaves the machine
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # each replica's log lines, each named
    try:
        import ray
        from ray import serve as ray_serve
    except ImportError as e:
        raise TandemError(f"--replicas needs Ray Serve, which is not installed ({e}): "
                          f"{INSTALL}") from None
    for sig in (signal.SIGINT, signal.SIGTERM):  # from here on, stopped as by Ctrl-C (also
        signal.signal(sig, _interrupt)  # where SIGINT came ignored: a background job)
    started, deployed = fleet.ray == "local", False
    temp = f"/tmp/ray-tandem-{os.getpid()}"  # a local instance's, to find its processes by
    try:
        _connect(ray, fleet.ray, temp)
        for sig in (signal.SIGINT, signal.SIGTERM):  # again: ray.init installs its own
            signal.signal(sig, _interrupt)
        threads = _threads(ray, settings, fleet)
        settings.engine = dataclasses.replace(settings.engine, n_threads=threads)
        deployed = True  # from here on, there may be something of ours to stop
        board = _deploy(ray, ray_serve, settings, fleet, threads, load)  # noqa: F841 (kept:
        # a named actor lives while its creator holds a handle)
        log.info("serving %d replica(s) x %d thread(s) at http://%s:%d (Ray: %s)",
                 fleet.replicas, threads, settings.host, settings.port,
                 "a local instance" if started else fleet.ray)
        while True:  # until SIGINT / SIGTERM
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):  # (SystemExit: Ray's own SIGTERM handler)
        log.info("stopping the fleet")
        return 0
    finally:
        _stop(ray, ray_serve if deployed else None, started)
        if started:
            _sweep(temp)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _loopback(address: str) -> bool:
    """A local instance, or a cluster this machine runs on 127.0.0.1 (`ray start --head
    --node-ip-address 127.0.0.1`): this driver is a node on loopback too."""
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    return address == "local" or host in ("127.0.0.1", "localhost", "::1")


def _check(settings) -> None:
    """What a fleet does not do (yet), and a port already taken, said before Ray starts (its
    proxy opens the port with SO_REUSEPORT: a second server there would share it)."""
    if "," in settings.host:
        raise TandemError(f"--host {settings.host}: with --replicas, one address (Ray Serve's "
                          "proxy listens on one)")
    host = settings.host.strip("[]")
    try:  # as one server opens it (SO_REUSEADDR: a closed connection's TIME_WAIT is no owner)
        family = socket.getaddrinfo(host, settings.port, type=socket.SOCK_STREAM)[0][0]
        socket.create_server((host, settings.port), family=family).close()
    except OSError as e:
        raise TandemError(f"cannot listen on {host}:{settings.port}: {e.strerror or e}; pick "
                          "another --port or --host") from None
    for on, flag in ((settings.sleep_idle_seconds > 0, "--sleep-idle-seconds"),
                     (bool(settings.tools) or settings.ui_mcp_proxy, "--tools/--ui-mcp-proxy")):
        if on:
            raise TandemError(f"{flag} is not supported with --replicas")


def _check_models(settings) -> None:
    """The models read (a name pulled once here, not by N replicas at once) and checked as
    `tandem check` does, so a file that cannot load is said once, before Ray starts."""
    from ..check import inspect_model

    inspect_model("target", settings.model)
    if settings.model_draft is not None and "draft-eagle3" not in settings.spec.types:
        inspect_model("draft", settings.model_draft)


def _connect(ray, address: str, temp: str) -> None:
    """Start a local instance (its files under `temp`), or join a cluster."""
    common = dict(namespace="tandem", log_to_driver=True, configure_logging=True,
                  logging_level=logging.WARNING)
    if address == "local":
        ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count(),
                 object_store_memory=256 * 2**20, _temp_dir=temp, **common)
        return
    if address != "auto":
        _answers(address)
    try:
        ray.init(address=address, **common)
    except (ConnectionError, RuntimeError, ValueError) as e:
        hint = "" if os.environ.get("RAY_AUTH_MODE") else (
            " (Ray clusters use token authentication by default: an explicit address needs "
            "RAY_AUTH_MODE=token, and the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN)")
        raise TandemError(f"--ray {address}: cannot join the Ray cluster: "
                          f"{str(e).splitlines()[0]}{hint}") from None


def _answers(address: str) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise TandemError(f"--ray {address}: give local, auto or host:port (the head's GCS "
                          "port, 6379 by default)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=ANSWER_S).close()
    except OSError as e:
        raise TandemError(f"--ray {address}: nothing answers there ({e.strerror or e}); is "
                          "`ray start --head` running on that host?") from None


def _threads(ray, settings, fleet: FleetSettings) -> int:
    """--threads per replica (0: the cluster's CPUs shared out), checked against the CPUs."""
    total = int(ray.cluster_resources().get("CPU", 0))
    free = int(ray.available_resources().get("CPU", 0))
    threads = settings.engine.n_threads or max(1, total // fleet.replicas)
    if fleet.replicas * threads > free:
        raise TandemError(f"--replicas {fleet.replicas} x --threads {threads} needs "
                          f"{fleet.replicas * threads} CPUs; the Ray cluster has {free} free "
                          f"(of {total}): lower --replicas or --threads, or add nodes")
    return threads


def _deploy(ray, ray_serve, settings, fleet: FleetSettings, threads: int, load):
    """The board (returned: it lives while held), the replicas, the ingress, the proxy."""
    from ray.serve.config import RequestRouterConfig

    from .board import NAME, NAMESPACE, Board
    from .ingress import Ingress
    from .replica import EngineReplica
    from .router import PrefixRouter

    board = ray.remote(Board).options(name=NAME, namespace=NAMESPACE, num_cpus=0).remote(
        settings.spec.suffix_pool)  # (a replica without a pool publishes nothing)
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    routing = RequestRouterConfig() if router_choice() == "pow2" else RequestRouterConfig(
        request_router_class=PrefixRouter,
        request_router_kwargs={"slack": settings.engine.n_parallel + 1})
    engines = ray_serve.deployment(
        EngineReplica, name="Engine", num_replicas=fleet.replicas,
        ray_actor_options={"num_cpus": threads},
        max_ongoing_requests=settings.max_queue + settings.engine.n_parallel,
        # past every replica's queue, a 503 at once (as one server's full queue), not a wait
        max_queued_requests=max(1, settings.max_queue * fleet.replicas),
        request_router_config=routing,
        health_check_period_s=2, health_check_timeout_s=30, graceful_shutdown_timeout_s=5,
        max_constructor_retry_count=1, logging_config=quiet)
    ingress = ray_serve.deployment(
        Ingress, name="Ingress", num_replicas=1,
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000, logging_config=quiet)
    ray_serve.start(http_options={"host": settings.host, "port": settings.port},
                    logging_config=quiet)
    # the ingress first, in an application of its own: it answers at once (/health 503
    # "Loading model" until a replica is ready), as one server listens before it loads
    ray_serve.run(ingress.bind(settings, fleet.replicas, ENGINES), name=APP, route_prefix="/",
                  logging_config=quiet)
    try:
        ray_serve.run(engines.bind(settings, load), name=ENGINES, route_prefix=None,
                      logging_config=quiet)
    except RuntimeError as e:  # a replica's constructor failed (the models did not load)
        raise TandemError(f"the replicas did not start: {str(e).splitlines()[0]} (each "
                          "replica's 'error:' line is above)") from None
    return board


def _stop(ray, ray_serve, started: bool) -> None:
    """Everything this command started: the whole local instance, or on a joined cluster the
    application and the board."""
    try:
        # a local instance goes whole with ray.shutdown, Serve's graceful stop skipped (it
        # took 3-4 s, most of the 5 s llama.cpp's test suite gives a server to stop)
        if ray_serve is not None and not started:
            from .board import NAME, NAMESPACE

            ray_serve.delete(APP)
            ray_serve.delete(ENGINES)
            ray.kill(ray.get_actor(NAME, namespace=NAMESPACE))
    except Exception as e:  # stopping: say it, go on
        log.warning("stopping Ray Serve: %s", e)
    finally:
        ray.shutdown()


def _sweep(temp: str) -> None:
    """The local instance's processes still running after ray.shutdown (its node agents, which
    outlive a stopped raylet; any, after a stop in the middle of starting), found by the files
    they hold open in the instance's own folder (their titles replace their command lines),
    and killed by their ids."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            ours = any(os.readlink(fd).startswith(temp) for fd in (proc / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        if ours:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass
