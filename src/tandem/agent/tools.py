"""llama-server's built-in tools for agents (--tools, --tools-runtime): what GET /tools lists
and POST /tools {"tool", "params", "stream"} runs (the routes: tandem/server/experimental.py).

    read_file          a file, or lines start_line..end_line of it (append_loc: "N→" prefixes)
    file_glob_search   files (or dirs) under a path matching a glob; .gitignore in a git tree
    grep_search        a regular expression (or literal) in files, with context lines
    exec_shell_command `sh -c COMMAND`, output capped, timed out; stream: true sends SSE
                       {"chunk"} events, then {"done": true} (and "error" if it failed)
    write_file         create or replace a file (parent folders made)
    edit_file          exact replacements, each unique and disjoint (edit.py)
    get_info           the OS (uname -a) and the working directory

A tool's own failure is 200 {"error": "..."}; a body that is not a call is 400, an unknown tool
(or stream on one that cannot) 404, an unusable runtime 500. Headers: x-tool-cwd (relative
paths resolve against it; a "cwd" from the model is dropped), x-tool-runtime (an isolate, see
runtime.py; else --tools-runtime's), x-resp-type: base64 (read_file's raw bytes).
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass

from .edit import EditError, apply_edits
from .glob import path_glob_match
from .runtime import TOOL_NAMES, check_tools, make_io, make_runtime

READ_MAX = 16 * 1024  # read_file's text answer, in bytes
READ_MAX_BASE64 = 32 * 1024 * 1024
SEARCH_MAX = 100  # file_glob_search's entries
GREP_MAX = 100  # grep_search's matches
EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT = 60  # seconds
INFO_MAX, INFO_TIMEOUT = 4096, 5


class BadParams(Exception):
    """The call's JSON is not what the tool takes: 400."""


class UnknownTool(Exception):
    """No such tool, or stream asked of one that cannot: 404."""


class Stream:
    """exec_shell_command's output as it comes: push() a chunk, alive() while the client is."""

    def __init__(self, push: Callable[[str], None], alive: Callable[[], bool]) -> None:
        self.push, self.alive = push, alive


def _required(params: dict, key: str) -> str:
    if key not in params:
        raise BadParams(f"missing parameter '{key}'")
    if not isinstance(params[key], str):
        raise BadParams(f"parameter '{key}' must be a string")
    return params[key]


def _value(params: dict, key, default):
    """params[key] if it has the default's type, else the default (as llama-server's
    json_value: a missing, null or mistyped field takes the default)."""
    v = params.get(key)
    if isinstance(default, bool):
        return v if isinstance(v, bool) else default
    if isinstance(default, int):
        if isinstance(v, float) and v == v and abs(v) != float("inf"):
            return int(v)
        return v if isinstance(v, int) and not isinstance(v, bool) else default
    return v if isinstance(v, str) else default


def _io(params: dict):
    return make_io(_value(params, "cwd", ""), _value(params, "runtime", ""))


def _text_lines(data: bytes) -> list[bytes]:
    """Lines as std::getline gives them: no empty last one after a final newline."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def _bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def read_file(p: dict, _stream: Stream | None = None) -> dict:
    path = _required(p, "path")
    start, end = _value(p, "start_line", 1), _value(p, "end_line", -1)  # end -1: no limit
    append_loc = _value(p, "append_loc", False)
    as_base64 = _value(p, "resp_type", "") == "base64"  # x-resp-type: not the model's choice
    io = _io(p)
    size = io.file_size(path)
    if size is None:
        return {"error": f"cannot stat file: {path}"}
    if as_base64 and size > READ_MAX_BASE64:
        return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
    if not as_base64 and size > READ_MAX and end == -1:
        return {"error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/"
                         "end_line to read a portion."}
    data = io.read_file(path)
    if data is None:
        return {"error": f"failed to open file: {path}"}
    if as_base64:
        return {"base64": base64.b64encode(data).decode(), "size_bytes": len(data)}
    out = bytearray()
    for n, line in enumerate(_text_lines(data), 1):
        if n < start:
            continue
        if end != -1 and n > end:
            break
        piece = (f"{n}\u2192".encode() if append_loc else b"") + line + b"\n"
        if len(out) + len(piece) > READ_MAX:
            out += b"[output truncated]"
            break
        out += piece
    return {"plain_text_response": out.decode("utf-8", "replace")}


def file_glob_search(p: dict, _stream: Stream | None = None) -> dict:
    io = _io(p)
    path = _required(p, "path")
    base = io.resolve(path)
    include, exclude = _value(p, "include", "**"), _value(p, "exclude", "")
    kind = _value(p, "type", "file")
    max_depth = max(0, _value(p, "max_depth", 0))
    limit = _value(p, "limit", SEARCH_MAX)
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    limit = min(limit, SEARCH_MAX)
    if kind not in ("file", "dir", "all"):
        return {"error": f'invalid type: {kind} (expected "file", "dir" or "all")'}
    listing = io.list_entries(base, max_depth, kind)
    if listing.err:
        return {"error": f"{listing.err}: {path}"}
    found = [(rel, is_dir) for rel, is_dir in listing.entries if path_glob_match(include, rel)
             and not (exclude and path_glob_match(exclude, rel))]
    shown = found[:limit]
    text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(found)}\n"
    if len(found) > len(shown):
        text += (f"[{len(shown)} results limit reached ({len(found)} total matches). Refine "
                 "the glob pattern to narrow the search.]\n")
    if listing.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    # `base` is absolute, so a client (a file picker) can join the entries to it
    return {"plain_text_response": text, "base": base, "entries": [
        {"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]}


_REGEX_SPECIALS = set("\\^$.|?*+()[]{}")


def grep_search(p: dict, _stream: Stream | None = None) -> dict:
    path, pattern = _required(p, "path"), _required(p, "pattern")
    include, exclude = _value(p, "include", "**"), _value(p, "exclude", "")
    numbered = _value(p, "return_line_numbers", False)
    context = max(0, _value(p, "context_lines", 0))
    if _value(p, "literal", False):
        pattern = "".join("\\" + c if c in _REGEX_SPECIALS else c for c in pattern)
    try:
        regex = re.compile(pattern, re.IGNORECASE if _value(p, "ignore_case", False) else 0)
    except re.error as e:
        return {"error": f"invalid regex: {e}"}
    io = _io(p)
    where = io.resolve(path)
    if io.is_regular_file(where):
        files = [(where, path)]
    elif io.is_directory(where):
        listing = io.list_entries(where, 0, "file")
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        files = [(posixpath.join(where, rel), rel) for rel, _ in listing.entries
                 if path_glob_match(include, rel) and not (exclude and
                                                           path_glob_match(exclude, rel))]
    else:
        return {"error": f"path does not exist: {path}"}
    out, total, full = [], 0, False
    numbered = numbered or context > 0
    for full_path, shown_path in files:
        data = io.read_file(full_path)
        if data is None:
            continue
        lines = [line.decode("utf-8", "replace") for line in _text_lines(data)]
        for i, line in enumerate(lines):
            if total >= GREP_MAX:
                full = True
                break
            if not regex.search(line):
                continue
            for j in range(max(0, i - context), min(len(lines) - 1, i + context) + 1):
                mark = ":" if j == i else "-"
                out.append(f"{shown_path}{mark}{f'{j + 1}{mark}' if numbered else ''}"
                           f"{lines[j]}\n")
            if context > 0:
                out.append("--\n")
            total += 1
        if full:
            break
    text = "".join(out) + f"\n---\nTotal matches: {total}\n"
    if full:
        text += f"[{GREP_MAX} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}


def exec_shell_command(p: dict, stream: Stream | None = None) -> dict | None:
    command = _required(p, "command")
    timeout = min(_value(p, "timeout", 10), EXEC_MAX_TIMEOUT)
    max_output = _value(p, "max_output_size", EXEC_MAX_OUTPUT)
    max_output = EXEC_MAX_OUTPUT if max_output < 0 else min(max_output, EXEC_MAX_OUTPUT)
    io = _io(p)
    if stream is None:
        res = io.run(["sh", "-c", command], max_output, timeout)
        return {"plain_text_response": res.text + _exit_line(res)}

    def on_chunk(chunk: str) -> bool:
        if chunk:
            stream.push(chunk)
        return stream.alive()

    res = io.run(["sh", "-c", command], max_output, timeout, on_chunk)
    if stream.alive():
        stream.push(_exit_line(res))
    return None


def _exit_line(res) -> str:
    return f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out
                                                 else "")


def write_file(p: dict, _stream: Stream | None = None) -> dict:
    path, content = _required(p, "path"), _required(p, "content")
    data = _bytes(content)
    if not _io(p).write_file(path, data):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file written successfully", "path": path, "bytes": len(data)}


def edit_file(p: dict, _stream: Stream | None = None) -> dict:
    path = _required(p, "path")
    if "edits" not in p:
        raise BadParams("missing parameter 'edits'")
    if not isinstance(p["edits"], list) or not p["edits"]:
        return {"error": '"edits" must be a non-empty array'}
    edits = []
    for i, e in enumerate(p["edits"]):
        if not isinstance(e, dict):
            raise BadParams(f"edits[{i}] must be an object")
        edits.append((_required(e, "old_text"), _required(e, "new_text")))
        if not edits[-1][0]:
            return {"error": f"edits[{i}].old_text must not be empty"}
    io = _io(p)
    data = io.read_file(path)
    if data is None:
        return {"error": f"failed to open file: {path}"}
    try:
        new = apply_edits(data.decode("utf-8", "surrogateescape"), edits, path)
    except EditError as e:
        return {"error": str(e)}
    if not io.write_file(path, _bytes(new)):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


def get_info(p: dict, _stream: Stream | None = None) -> dict:
    io = _io(p)
    res = io.run(["uname", "-a"], INFO_MAX, INFO_TIMEOUT)  # an isolate is always POSIX
    cwd = _value(p, "cwd", "")
    if not cwd and not io.isolate:
        cwd = os.getcwd()
    elif not cwd:
        pwd = io.run(["pwd"], INFO_MAX, INFO_TIMEOUT)
        cwd = pwd.text.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
    return {"os": res.text.strip() if res.exit_code == 0 and not res.timed_out else "unknown",
            "cwd": cwd}


def _fn(name: str, description: str, properties: dict, required: list[str] | None) -> dict:
    params = {"type": "object", "properties": properties}
    if required is not None:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": params}}


def _p(type_: str, description: str) -> dict:
    return {"type": type_, "description": description}


@dataclass(frozen=True)
class Tool:
    name: str
    display_name: str
    write: bool  # the client should ask the user first
    run: Callable[[dict, Stream | None], dict | None]
    definition: dict
    streams: bool = False

    def to_json(self) -> dict:
        return {"display_name": self.display_name, "tool": self.name, "type": "server",
                "permissions": {"write": self.write}, "uses_cwd": True,
                "definition": self.definition}


_GLOB_HELP = ("A pattern without '/' (\"*.cpp\") matches the base name at any depth; one with "
              "'/' matches the whole relative path, with \"**/\" put in front unless it starts "
              "with \"**/\" or '/'.")
_EDIT_ITEM = {"type": "object", "properties": {
    "old_text": _p("string", "Exact text to find: unique in the file, not overlapping another "
                             "edit"),
    "new_text": _p("string", "The text to put in its place")},
    "required": ["old_text", "new_text"]}
TOOLS = (
    Tool("read_file", "Read file", False, read_file, _fn(
        "read_file", "Read a file, or the 1-based line range start_line..end_line of it. With "
        "append_loc each line starts with its number (\"1\u2192...\").", {
            "path": _p("string", "Path to the file"),
            "start_line": _p("integer", "First line to read, 1-based (default: 1)"),
            "end_line": _p("integer", "Last line to read, inclusive (default: the end)"),
            "append_loc": _p("boolean", "Start each line with its line number")}, ["path"])),
    Tool("file_glob_search", "File search", False, file_glob_search, _fn(
        "file_glob_search", "Find files matching a glob pattern under a directory, at any "
        "depth. Files ignored by .gitignore (in a git repository) and junk directories (.git, "
        "node_modules, build, dist, ...) are skipped. " + _GLOB_HELP + " type=\"dir\" or "
        "\"all\" lists directories too, written with a trailing '/' (no .gitignore filtering "
        "for them).", {
            "path": _p("string", "Directory to search in"),
            "include": _p("string", "Glob of the entries to list, e.g. \"*.cpp\" or "
                                    "\"src/**/*.cpp\" (default: **)"),
            "exclude": _p("string", "Glob of the entries to leave out"),
            "type": _p("string", "\"file\" (default), \"dir\" or \"all\""),
            "max_depth": _p("integer", "How deep to go: 0 = no limit (default), 1 = direct "
                                       "children only"),
            "limit": _p("integer", f"Most results to return, at most {SEARCH_MAX} (default "
                                   f"{SEARCH_MAX})")}, ["path"])),
    Tool("grep_search", "Grep search", False, grep_search, _fn(
        "grep_search", "Search files under a path for a pattern; answers the matching lines "
        "with their file (relative to the directory searched). Files ignored by .gitignore "
        "(in a git repository) and junk directories (.git, node_modules, build, dist, ...) "
        "are skipped. include/exclude: " + _GLOB_HELP, {
            "path": _p("string", "File or directory to search in"),
            "pattern": _p("string", "Regular expression to look for (a plain string with "
                                    "literal)"),
            "include": _p("string", "Glob of the files to search (default: **)"),
            "exclude": _p("string", "Glob of the files to leave out"),
            "return_line_numbers": _p("boolean", "Give each line's number"),
            "literal": _p("boolean", "The pattern is a plain string (default: false)"),
            "ignore_case": _p("boolean", "Ignore case (default: false)"),
            "context_lines": _p("integer", "Lines to show before and after each match "
                                           "(default: 0)")}, ["path", "pattern"])),
    Tool("exec_shell_command", "Execute shell command", True, exec_shell_command, _fn(
        "exec_shell_command", "Run a shell command; answers its output (stdout and stderr "
        "together) and exit code.", {
            "command": _p("string", "The shell command"),
            "timeout": _p("integer", f"Seconds it may run (default 10, max {EXEC_MAX_TIMEOUT})"),
            "max_output_size": _p("integer", f"Most bytes of output to keep (default "
                                             f"{EXEC_MAX_OUTPUT})")}, ["command"]),
         streams=True),
    Tool("write_file", "Write file", True, write_file, _fn(
        "write_file", "Write a file, replacing it if it exists; missing parent directories "
        "are made. For changes to part of a file, see edit_file.", {
            "path": _p("string", "Path of the file"),
            "content": _p("string", "What to write")}, ["path", "content"])),
    Tool("edit_file", "Edit file", True, edit_file, _fn(
        "edit_file", "Edit a file by exact text replacement. Each edits[].old_text must occur "
        "once in the file and is matched against the original content (not after the other "
        "edits); edits must not overlap, so merge nearby changes into one. To replace the "
        "whole file, use write_file.", {
            "path": _p("string", "Path of the file"),
            "edits": {"type": "array", "description": "The replacements, one or more",
                      "items": _EDIT_ITEM}}, ["path", "edits"])),
    Tool("get_info", "Get Runtime Info", False, get_info, _fn(
        "get_info", "The OS name and version, and the current working directory", {}, None)),
)
assert tuple(t.name for t in TOOLS) == TOOL_NAMES


class Toolbox:
    """The tools --tools enabled, and --tools-runtime's isolate (a container it spawned is
    removed by close())."""

    def __init__(self, names: list[str], runtime: str | None) -> None:
        check_tools(names, runtime)
        self.runtime = make_runtime(runtime) if runtime else None
        self.tools = {t.name: t for t in TOOLS if "all" in names or t.name in names}

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()

    def prepare(self, raw: bytes, headers) -> tuple[Tool, dict, bool]:
        """The call in a POST /tools body: the tool, its params with the headers' cwd,
        runtime and resp_type put in (the model's own dropped), and whether to stream."""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadParams(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict) or not isinstance(body.get("tool"), str):
            raise BadParams('the request body must be {"tool": name, "params": {...}}')
        params, stream = body.get("params", {}), body.get("stream", False)
        if not isinstance(params, dict) or not isinstance(stream, bool):
            raise BadParams('"params" must be an object and "stream" a boolean')
        for key, header in (("cwd", "x-tool-cwd"), ("runtime", "x-tool-runtime"),
                            ("resp_type", "x-resp-type")):
            params.pop(key, None)
            if headers.get(header):  # the header's bytes as UTF-8 (Starlette reads latin-1)
                params[key] = headers[header].encode("latin-1").decode("utf-8", "replace")
        if "runtime" not in params and self.runtime is not None:
            params["runtime"] = self.runtime.spec()
        tool = self.tools.get(body["tool"])
        if tool is None:
            raise UnknownTool(f'unknown tool "{body["tool"]}"')
        if stream and not tool.streams:
            raise UnknownTool(f'tool "{tool.name}" does not support stream = true')
        return tool, params, stream
