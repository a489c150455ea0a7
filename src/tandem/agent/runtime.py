"""Where the agent tools (tools.py) read, write and run: this machine (LocalIO), or an
isolate that runs every operation as a command, as llama-server's --tools-runtime and
x-tool-runtime: a running container (`docker exec` / `podman exec`, ContainerIO) or a remote
POSIX host over ssh (SshIO). An isolate needs sh, cat, wc, mkdir, dirname, find and timeout.

Also: the one subprocess runner (output cap, time limit, chunks as they come), and the
container that `--tools-runtime docker:<image>` starts for the server's lifetime (removed when
the server exits).
"""

from __future__ import annotations

import codecs
import logging
import os
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("tandem.server")

LIST_TIMEOUT = 15  # seconds one directory listing may take, git or the walker
GIT_MAX_OUTPUT = 8 * 1024 * 1024
ISOLATE_TIMEOUT = 15  # seconds for an isolate's helper commands (stat, cat, find, ...)
ISOLATE_READ_MAX = 64 * 1024 * 1024
# listed (a folder one may pick) but never walked into: they can be enormous
JUNK_DIRS = (".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist",
             "build", "target", ".cache", ".idea", ".vscode")
ENGINES = ("docker", "podman")
# the built-in tools (tools.py), here so that checking --tools imports nothing heavy
TOOL_NAMES = ("read_file", "file_glob_search", "grep_search", "exec_shell_command",
              "write_file", "edit_file", "get_info")


class ToolRuntimeError(Exception):
    """A runtime that cannot be used (unknown, malformed, not running): answered 500."""


@dataclass
class Exec:
    data: bytes = b""  # the output as read, capped (then "\n[output truncated]" follows)
    exit_code: int = -1
    timed_out: bool = False

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def run_process(args: list[str], max_output: int, timeout: float,
                on_chunk: Callable[[str], bool] | None = None, combine_stderr: bool = True,
                cwd: str = "", stdin_data: bytes | None = None) -> Exec:
    """Run `args` (no shell of its own), stdin fed then closed, stdout (and stderr, combined)
    read as it comes. Past max_output bytes the rest is read and dropped (a full pipe would
    stall the child). After `timeout` seconds the whole process group is killed. on_chunk gets
    each piece of output as text; returning False kills the process (the client left)."""
    try:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
                                cwd=cwd or None, start_new_session=True)
    except (OSError, ValueError):
        return Exec(b"failed to spawn process")
    timed_out = threading.Event()

    def expire() -> None:
        if proc.returncode is None:
            timed_out.set()
            _kill(proc)

    timer = threading.Timer(max(timeout, 0), expire)
    timer.daemon = True
    timer.start()
    try:
        if stdin_data:
            proc.stdin.write(stdin_data)
        proc.stdin.close()
    except OSError:  # the child left without reading: its exit code says what happened
        pass
    out, truncated = bytearray(), False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    fd = proc.stdout.fileno()
    while buf := os.read(fd, 4096):
        if truncated:
            continue
        if len(out) + len(buf) > max_output:
            buf, truncated = buf[:max(0, max_output - len(out))], True
        out += buf
        if on_chunk is not None and buf and not on_chunk(decoder.decode(buf)):
            _kill(proc)
            break
    proc.stdout.close()
    code = proc.wait()
    timer.cancel()
    if truncated:
        out += b"\n[output truncated]"
    # killed by a signal: EXIT_FAILURE, as llama-server's subprocess library reports it
    return Exec(bytes(out), code if code >= 0 else 1, timed_out.is_set())


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Listing:
    entries: list[tuple[str, bool]] = field(default_factory=list)  # ('/'-joined rel, is_dir)
    err: str = ""  # set when the base is not a directory
    truncated: bool = False  # the walk could not see everything (time budget, unreadable)


def _depth(rel: str) -> int:
    return 1 + rel.count("/")


def _lines(text: str, strip_dot_slash: bool = False) -> list[str]:
    out = []
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if strip_dot_slash:
            line = line.removeprefix("./")
        if line:
            out.append(line.replace("\\", "/"))
    return out


class LocalIO:
    """This machine. Relative paths resolve against `cwd` (the x-tool-cwd header), else the
    server's working directory; a leading ~ is the home folder."""

    isolate = False

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        home = os.environ.get("HOME", "")
        if path[:1] == "~" and (len(path) == 1 or path[1] in "/\\") and home:
            path = home + path[1:]
        if not os.path.isabs(path):
            try:
                path = os.path.join(self.cwd or os.getcwd(), path)
            except OSError:
                return path
        return os.path.normpath(path)  # no "." or ".." reaches git or the client

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def file_size(self, path: str) -> int | None:
        try:
            st = os.stat(self.resolve(path))
        except (OSError, ValueError):
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def read_file(self, path: str) -> bytes | None:
        try:
            with open(self.resolve(path), "rb") as f:
                return f.read()
        except (OSError, ValueError):
            return None

    def write_file(self, path: str, data: bytes) -> bool:
        full = self.resolve(path)
        try:
            os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
        except (OSError, ValueError):
            return False
        return True

    def run(self, args: list[str], max_output: int, timeout: float,
            on_chunk: Callable[[str], bool] | None = None) -> Exec:
        return run_process(args, max_output, timeout, on_chunk, True, self.cwd)

    def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        """Entries under `base` (absolute), kind "file", "dir" or "all"; max_depth 0: any
        depth, 1: the direct children. Files come from `git ls-files` where base is in a git
        work tree (so .gitignore applies), else from a walk that skips JUNK_DIRS."""
        if not os.path.isdir(base):
            return Listing(err="path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_TIMEOUT
        if kind == "file":  # git cannot list directories
            res = self.run(["git", "-C", base, "ls-files", "--cached", "--others",
                            "--exclude-standard"], GIT_MAX_OUTPUT, LIST_TIMEOUT)
            if res.exit_code == 0 and not res.timed_out:
                return Listing([(rel, False) for rel in _lines(res.text)
                                if not (max_depth > 0 and _depth(rel) > max_depth)
                                and os.path.isfile(os.path.join(base, rel))])
        out = Listing()
        stack = [(base, "", 0)]
        while stack:
            folder, rel_folder, depth = stack.pop()
            try:
                with os.scandir(folder) as it:
                    children = list(it)
            except PermissionError:
                continue
            except OSError:
                out.truncated = True
                continue
            for entry in children:
                if time.monotonic() >= deadline:
                    out.truncated = True
                    return out
                rel = f"{rel_folder}/{entry.name}" if rel_folder else entry.name
                try:
                    is_dir = entry.is_dir()
                    is_file = not is_dir and entry.is_file()
                    is_link = entry.is_symlink()  # a link may loop back: never walked
                except OSError:
                    continue
                if is_dir:
                    if kind in ("dir", "all"):
                        out.entries.append((rel, True))
                    if entry.name not in JUNK_DIRS and not is_link and (
                            max_depth == 0 or depth + 1 < max_depth):
                        stack.append((entry.path, rel, depth + 1))
                elif is_file and kind in ("file", "all"):
                    out.entries.append((rel, False))
        return out


class IsolateIO:
    """Every operation as a POSIX command in the isolate; build_argv() wraps it for the
    transport. Paths are the isolate's: relative ones are joined to `cwd` as they are."""

    isolate = True

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        return path if not self.cwd or path.startswith("/") else f"{self.cwd}/{path}"

    def _exec(self, inner: list[str], max_output: int, combine: bool = True) -> Exec:
        return run_process(self.build_argv(inner, False), max_output, ISOLATE_TIMEOUT, None,
                           combine)

    def _test(self, flag: str, path: str) -> bool:
        res = self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", path], 4096)
        return res.exit_code == 0 and not res.timed_out

    def is_directory(self, path: str) -> bool:
        return self._test("-d", self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return self._test("-f", self.resolve(path))

    def file_size(self, path: str) -> int | None:
        res = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        words = res.text.split()
        if res.exit_code != 0 or res.timed_out or not words or not words[0].isdigit():
            return None
        return int(words[0])

    def read_file(self, path: str) -> bytes | None:
        # stderr apart: it must not be spliced into the file's bytes
        res = self._exec(["cat", "--", self.resolve(path)], ISOLATE_READ_MAX, combine=False)
        return res.data if res.exit_code == 0 and not res.timed_out else None

    def write_file(self, path: str, data: bytes) -> bool:
        # the content goes on stdin: nothing for the far side to re-parse, no temporary file
        argv = self.build_argv(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_",
                                self.resolve(path)], True)
        res = run_process(argv, 4096, ISOLATE_TIMEOUT, None, True, "", data)
        return res.exit_code == 0 and not res.timed_out

    def run(self, args: list[str], max_output: int, timeout: float,
            on_chunk: Callable[[str], bool] | None = None) -> Exec:
        # `timeout` inside the isolate: killing the local client leaves the far process be;
        # the local limit is 5 s longer so the far one ends first, cleanly
        inner = ["timeout", f"{int(timeout)}s", *args]
        if self.cwd:  # 127: what a shell reports for a command it could not run
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return run_process(self.build_argv(inner, True), max_output, timeout + 5, on_chunk)

    def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        if not self._test("-d", base):
            return Listing(err="path does not exist or is not a directory")
        if kind == "file":
            res = self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others '
                              '--exclude-standard', "_", base], GIT_MAX_OUTPUT)
            if res.exit_code == 0 and not res.timed_out:
                return Listing([(rel, False) for rel in _lines(res.text)
                                if not (max_depth > 0 and _depth(rel) > max_depth)])
        out = Listing()
        for is_dir in ((True,) if kind == "dir" else (False,) if kind == "file"
                       else (True, False)):
            out.entries += [(rel, is_dir) for rel in self._find(base, max_depth, is_dir, out)]
        return out

    def _find(self, base: str, max_depth: int, dirs: bool, out: Listing) -> list[str]:
        # -mindepth/-maxdepth and -prune: busybox's find has them as GNU's does
        prune = " -o ".join(f"-name {n}" for n in JUNK_DIRS)
        cmd = 'cd "$1" && find . -mindepth 1'
        if max_depth > 0:
            cmd += f" -maxdepth {max_depth}"
        cmd += f" \\( {prune} \\) -prune"
        cmd += " -print -o -type d -print" if dirs else " -o -type f -print"
        res = self._exec(["sh", "-c", cmd, "_", base], GIT_MAX_OUTPUT)
        out.truncated = out.truncated or res.timed_out
        return _lines(res.text, strip_dot_slash=True)


class ContainerIO(IsolateIO):
    """A running container, through `<engine> exec` (docker and podman take the same verbs)."""

    def __init__(self, engine: str, container: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.engine, self.container = engine, container

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container, *inner]


class SshIO(IsolateIO):
    """A remote host over ssh: remoting, not isolation (the tools can do what the account
    can). Key-based only, with a host key trusted beforehand: nothing here can answer a
    prompt."""

    def __init__(self, target: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.target = target

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        # the remote shell re-parses its command line: the command goes as one quoted word
        return ["ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
                "-o", "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes",
                *([] if needs_stdin else ["-n"]), self.target, quote_join(inner)]


def quote_join(argv: list[str]) -> str:
    """One string a POSIX shell splits back into exactly `argv`."""
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


def _ascii_alnum(c: str) -> bool:
    return c.isascii() and c.isalnum()


def valid_ssh_target(target: str) -> bool:
    """No leading '-': ssh would read it as an option (-oProxyCommand=... runs anything)."""
    return bool(target) and target[0] != "-" and all(
        _ascii_alnum(c) or c in ".-_@" for c in target)


def valid_container_id(cid: str) -> bool:
    """Starts with a letter or digit: an id like --privileged would be an engine option."""
    return bool(cid) and _ascii_alnum(cid[0]) and all(_ascii_alnum(c) or c in ".-_" for c in cid)


def parse_container(spec: str) -> tuple[str, str, bool] | None:
    """"<engine>-container:<id>" -> (engine, id, True); "<engine>:<image>" -> (engine, image,
    False); anything else None."""
    for engine in ENGINES:
        if spec.startswith(f"{engine}-container:"):
            return engine, spec[len(engine) + 11:], True
        if spec.startswith(f"{engine}:"):
            return engine, spec[len(engine) + 1:], False
    return None


def make_io(cwd: str, runtime: str) -> LocalIO | IsolateIO:
    """The IO a tool call runs through: the host when `runtime` is empty, else the isolate it
    names. A runtime it cannot use is an error, never a fallback to the host."""
    if not runtime:
        return LocalIO(cwd)
    container = parse_container(runtime)
    if container is not None:
        engine, cid, attach = container
        if not attach:  # spawning belongs to --tools-runtime, a call only attaches
            raise ToolRuntimeError(f"tool runtime must name a running container: {runtime}")
        if not valid_container_id(cid):
            raise ToolRuntimeError(f"invalid container id: {cid}")
        return ContainerIO(engine, cid, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[4:]
        if not valid_ssh_target(target):
            raise ToolRuntimeError(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    raise ToolRuntimeError(f"unknown tool runtime: {runtime}")


class Runtime:
    """--tools-runtime naming a target that exists already (a container id, an ssh host):
    checked once at start, then passed to every call."""

    def __init__(self, spec: str) -> None:
        make_io("", spec)  # a bad spec fails the start
        self._spec = spec

    def spec(self) -> str:
        return self._spec

    def close(self) -> None:
        pass


class ContainerRuntime(Runtime):
    """--tools-runtime <engine>:<image>: `<engine> run --rm -i <image> sh`, its stdin held
    open so the shell (the container's first process) waits; closing it at exit ends the
    container, and --rm removes it. A container that died on its own is started again."""

    def __init__(self, engine: str, image: str) -> None:
        if not image:
            raise ToolRuntimeError(f"--tools-runtime {engine}:<image> requires an image name")
        if image.startswith("-"):  # it would be read as an option of `<engine> run`
            raise ToolRuntimeError(f"invalid image name: {image}")
        self.engine, self.image, self.container = engine, image, ""
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self._spawn()

    def _spawn(self) -> None:
        self.close()
        fd, cidfile = tempfile.mkstemp(prefix="tandem-tools-runtime-cid-", suffix=".tmp")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses to write a cidfile that exists
        try:
            self.proc = subprocess.Popen(
                [self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        except OSError as e:
            raise ToolRuntimeError(f"failed to spawn {self.engine} container for tools runtime "
                                   f"(image: {self.image}): {e.strerror or e}") from None
        cid = ""
        for _ in range(100):
            cid = _read_first_line(cidfile)
            if cid or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if os.path.exists(cidfile):
            os.unlink(cidfile)
        if not cid:
            self.close()
            raise ToolRuntimeError(f"timed out waiting for {self.engine} container to start "
                                   f"(image: {self.image})")
        self.container = cid

    def spec(self) -> str:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                log.warning("%s tools runtime container %r died, starting another",
                            self.engine, self.container)
                self._spawn()
            return f"{self.engine}-container:{self.container}"

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().strip()
    except OSError:
        return ""


def check_tools(names: list[str], runtime: str | None) -> None:
    """--tools and --tools-runtime, before anything starts: every name known ("all": every
    tool), the runtime well-formed (ToolRuntimeError, ValueError)."""
    for name in names:
        if name != "all" and name not in TOOL_NAMES:
            raise ValueError(f'unknown tool "{name}". available tools: {", ".join(TOOL_NAMES)}')
    container = parse_container(runtime or "")
    if container is not None and not container[2]:
        if not container[1]:
            raise ToolRuntimeError(f"--tools-runtime {container[0]}:<image> requires an image "
                                   "name")
        if container[1].startswith("-"):
            raise ToolRuntimeError(f"invalid image name: {container[1]}")
    elif runtime:
        make_io("", runtime)


def make_runtime(spec: str) -> Runtime:
    container = parse_container(spec)
    if container is not None and not container[2]:
        return ContainerRuntime(container[0], container[1])
    return Runtime(spec)
