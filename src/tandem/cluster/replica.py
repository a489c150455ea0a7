"""An engine replica: one Tandem engine and the server's own FastAPI app (server/app.py), the
same routes, guard and errors as one `tandem serve`, called in-process through ASGI.

The ingress calls `call(request, route=...)` through a streaming handle; it yields

    {"replica": id}                  at once: the replica has the request (ingress.py retries
                                     a request that fails before this on another replica)
    {"status": int, "headers": [..]} the response's start
    bytes, ...                       its body as the app sends it (one chunk per SSE event)

When the ingress's client goes away, Ray cancels this generator: the app is told the client
disconnected (its `receive` answers http.disconnect), which cancels the generation.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading

from .board import NAME, NAMESPACE, snapshot
from .sharedpool import share

log = logging.getLogger("tandem.server")
REPORT_EVERY = 0.5  # seconds between reports to the board


def loopback_grpc() -> None:
    """Ray Serve 2.60 opens every replica's inter-deployment gRPC server on [::]:0, all
    interfaces, whatever address the node was given (serve/_private/replica.py,
    _on_initialized, which runs after the constructor). On a node advertised as loopback, the
    port is opened on 127.0.0.1 instead, as every other Ray server there is."""
    import ray
    from ray.serve._private import replica

    if ray.util.get_node_ip_address() not in ("127.0.0.1", "::1"):
        return
    original = replica.add_port_to_grpc_server
    if getattr(original, "tandem_loopback", False):
        return

    def on_loopback(server, address: str):
        return original(server, address.replace("[::]", "127.0.0.1"))

    on_loopback.tandem_loopback = True
    replica.add_port_to_grpc_server = on_loopback


class EngineReplica:
    """The deployment's class (launch.py): `load` is server/cli.py's model loading, handed in
    so this package never imports the command that imports it."""

    def __init__(self, settings, load) -> None:
        import ray
        from ray import serve

        from ..server.app import create_app
        from ..server.state import ServerState

        loopback_grpc()
        self.id = serve.get_replica_context().replica_id.unique_id
        _log_to_stderr(self.id, settings.verbose)
        self.state = ServerState(settings)
        try:
            load(self.state)  # the memory plan, the models, the warm-up, the worker
        except Exception as e:  # one line in the driver's log, then Ray's traceback
            log.error("error: %s", e)
            raise
        self.state.status = "ready"
        self.app = create_app(self.state)
        self.board = ray.get_actor(NAME, namespace=NAMESPACE)
        self.pool, self.after = share(self.state.engine), 0  # answers seen from the board
        self.stopped = threading.Event()
        threading.Thread(target=self._report, name="tandem-report", daemon=True).start()
        log.info("replica %s ready", self.id)

    def _report(self) -> None:
        """Twice a second: counters and new answers to the board, the others' answers back
        into this replica's pool (sharedpool.py)."""
        import ray

        while not self.stopped.wait(REPORT_EVERY):
            try:
                answers = self.pool.take_outbox() if self.pool is not None else []
                ref = self.board.report.remote(self.id, snapshot(self.state), answers,
                                               self.after)
                if self.pool is not None:
                    self.after, others = ray.get(ref, timeout=5)
                    self.pool.inbox.extend(others)
            except Exception as e:  # the board gone (the fleet is stopping), or slow
                log.debug("report: %s", e)

    async def _update(self) -> None:
        try:
            await asyncio.wait_for(self.board.update.remote(self.id, snapshot(self.state)), 2)
        except Exception as e:  # the board gone or slow: the next report carries it
            log.debug("update: %s", e)

    def __del__(self) -> None:  # Ray Serve calls it when the replica is stopped
        if hasattr(self, "stopped"):  # (not if the constructor failed)
            self.stopped.set()
            if self.state.worker is not None:
                self.state.worker.stop()

    async def call(self, request: dict, route=None):
        """One HTTP request through the app (`route` is the router's, unused here)."""
        yield {"replica": self.id}
        out: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        body = [request["body"]]

        async def receive() -> dict:
            if body:
                return {"type": "http.request", "body": body.pop(), "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def run() -> None:
            try:
                await self.app(_scope(request), receive, out.put)
            except Exception:  # the app's own handlers answered; this is past them
                log.exception("request %s %s", request["method"], request["path"])
            finally:
                out.put_nowait(None)

        task = asyncio.ensure_future(run())
        finished = False
        try:
            while (message := await out.get()) is not None:
                if message["type"] == "http.response.start":
                    yield {"status": message["status"],
                           "headers": [(k.decode("latin-1"), v.decode("latin-1"))
                                       for k, v in message.get("headers", [])]}
                elif message["type"] == "http.response.body":
                    if not message.get("more_body"):  # the counters first (board.update)
                        await self._update()
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body"):
                        break
            finished = True
        finally:  # or cancelled, because the client went away
            gone.set()
            if not finished and not task.done():
                task.cancel()


def _scope(request: dict) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": request["method"], "scheme": "http",
            "path": request["path"], "raw_path": request["path"].encode(),
            "query_string": request["query"].encode("latin-1"), "root_path": "",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in request["headers"]],
            "client": tuple(request["client"]) if request.get("client") else None,
            "server": ("127.0.0.1", 0), "state": {}}


def _log_to_stderr(replica: str, verbose: bool = False) -> None:
    """The server's and the engine's log lines in the replica's stderr (Ray's log files, and
    the driver's terminal), each naming the replica; with --verbose their debug lines too, as
    one server's (llama.cpp's test_kv_keep_only_active reads one)."""
    for name in ("tandem.server", "tandem.engine"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter(f"tandem[{replica}]: %(message)s"))
            logger.addHandler(h)
            logger.propagate = False
        logger.setLevel(logging.DEBUG if verbose else logging.INFO)
