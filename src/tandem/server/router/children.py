"""One child `tandem serve` per loaded model, as llama-server's router spawns itself: on a free
loopback port, with the model's own flags, and the router's command line for what every model
shares (--threads, --ctx-size, --sleep-idle-seconds ...). A child's memory is its own, so
unloading is its exit, and one model's failure never takes another down.

A child's command line, later words winning (argparse keeps the last value):

    python -m tandem.cli serve  [*] flags  [NAME] flags  router's flags  --model PATH
        [--mmproj P] [--model-draft D]  --host 127.0.0.1 --port P --alias NAME --no-ui

which is llama-server's precedence: the command line over the model's section over [*]. Its
log lines go to the router's stderr as `[NAME] line`, the last ones kept for a failure's
message.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import sys

import httpx

from .catalog import Entry

# the router's own flags and those it sets for each child: not handed down
ROUTER_ONLY = ("--host", "--port", "--api-key", "--alias", "-a", "--tags", "--models-dir",
               "--models-preset", "--models-max", "--models-autoload", "--no-models-autoload",
               "--model", "-m", "--model-draft", "-md", "--mmproj", "-mm", "--ui", "--webui",
               "--no-ui", "--no-webui", "-hf", "-hfr", "--hf-repo")
# the environment's versions of those (a child reads LLAMA_ARG_* as its flags)
ROUTER_ENV = ("LLAMA_ARG_HOST", "LLAMA_ARG_PORT", "LLAMA_API_KEY", "TANDEM_API_KEY",
              "LLAMA_ARG_ALIAS", "LLAMA_ARG_TAGS", "LLAMA_ARG_MODELS_DIR",
              "LLAMA_ARG_MODELS_PRESET", "LLAMA_ARG_MODELS_MAX", "LLAMA_ARG_MODELS_AUTOLOAD",
              "LLAMA_ARG_NO_MODELS_AUTOLOAD", "LLAMA_ARG_MODEL", "LLAMA_ARG_MODEL_DRAFT",
              "LLAMA_ARG_MMPROJ", "LLAMA_ARG_UI", "LLAMA_ARG_NO_UI", "LLAMA_ARG_HF_REPO")
HOST = "127.0.0.1"
LOG_LINES = 20
# the line a server logs once it is ready (server/cli.py's _load): /health is asked then, and
# only once a second otherwise, so that polling does not take CPU from the child's loading
READY_LINE = "tandem: ready: "
POLL = 1.0


def common_args(argv: list[str], parser) -> list[str]:
    """The router's command-line words every child gets: all but ROUTER_ONLY (and their
    values), as given."""
    known = parser._option_string_actions
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        action = known.get(name)
        takes = action is not None and action.nargs != 0 and "=" not in word
        if name in ROUTER_ONLY:
            i += 2 if takes else 1
            continue
        out += argv[i:i + (2 if takes else 1)]
        i += 2 if takes else 1
    return out


def child_argv(entry: Entry, common: list[str], port: int, draft: str | None) -> list[str]:
    """The child's command line for `entry` with `draft` (a path, or None for none)."""
    argv = [sys.executable, "-m", "tandem.cli", "serve", *entry.args, *common,
            *entry.model_args()]
    if draft is not None:
        argv += ["--model-draft", draft]
    return argv + ["--host", HOST, "--port", str(port), "--alias", entry.id, "--no-ui"]


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ROUTER_ENV}


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the router dies, even by SIGKILL, so that
    no model is left running without its router."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Child:
    """A running child: its process, port, and its last log lines."""

    def __init__(self, name: str, argv: list[str], port: int) -> None:
        self.name, self.argv, self.port = name, argv, port
        self.url = f"http://{HOST}:{port}"
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_LINES)
        self._reader: asyncio.Task | None = None
        self.said_ready = asyncio.Event()

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=child_env(),
            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self._reader = asyncio.create_task(self._copy_log())

    async def _copy_log(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            if line.startswith(READY_LINE):
                self.said_ready.set()
            sys.stderr.write(f"[{self.name}] {line}\n")
            sys.stderr.flush()

    async def wait_ready(self, client: httpx.AsyncClient) -> bool:
        """True once /health answers 200; False if the process exits first. /health is asked
        when the child logs READY_LINE, every POLL seconds otherwise (measured: polling every
        50 ms took ~0.15 s of CPU from a 2-core machine while the child laid out its weights)."""
        while self.proc is not None and self.proc.returncode is None:
            try:
                r = await client.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            waits = [asyncio.ensure_future(self.proc.wait()),
                     asyncio.ensure_future(self.said_ready.wait())]
            await asyncio.wait(waits, timeout=POLL, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        return False

    async def wait(self) -> int:
        assert self.proc is not None
        code = await self.proc.wait()
        if self._reader is not None:
            await asyncio.wait([self._reader], timeout=2)
        return code

    async def stop(self, timeout: float) -> None:
        """SIGTERM (the server's clean stop), SIGKILL after `timeout` seconds."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            self.proc.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()

    def discard(self) -> None:
        """Killed, and reaped in the background (a child the router will not use)."""
        self.kill()
        if self.proc is not None:
            asyncio.create_task(self.wait())

    def last_error(self) -> str:
        """The child's last error line (its log's last line that says error), or its last."""
        lines = [l for l in self.tail if l.strip()]
        errors = [l for l in lines if "error" in l.lower()]
        return (errors or lines or ["(no output)"])[-1]
