"""llama-server's built-in agent tools (--tools, --tools-runtime; GET/POST /tools) and its MCP
CORS proxy (--ui-mcp-proxy; GET/POST /cors-proxy), on a tiny model. What llama.cpp's
tools/server/tests/unit/test_tools_builtin.py and test_security.py check, and more:

- TOOLS: --tools all --ui-mcp-proxy --api-key (so CORS falls back to localhost, and every
  call needs the key);
- PLAIN: neither flag (both routes answer 403 feature_disabled).

The container runtime runs against a stand-in `docker` (a shell script that runs `exec`'s
command here), so the isolate's commands (sh, cat, find, timeout) are the real ones.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest

from tests import tiny
from tests.servers import AUTH, KEY, SERVE, Server

MARK = "tandem_agent_tools_marker_for_grep"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("agent")
    path = tiny.write_gguf(tiny.hf_model("qwen2", seed=3), d / "target.gguf", "qwen2")
    base = ["--model", str(path), "--ctx-size", "256", "-t", "1", "--no-warmup"]
    tools = Server([*base, "--tools", "all", "--ui-mcp-proxy", "--api-key", KEY], d / "tools.log")
    plain = Server(base, d / "plain.log")
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(120), (tools, plain)))
        yield SimpleNamespace(tools=tools, plain=plain, path=path, dir=d)
    finally:
        tools.stop()
        plain.stop()


def post(server: Server, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/tools", json=body, headers={**AUTH, **(headers or {})},
                      timeout=60)


def call(server: Server, tool: str, params: dict, headers: dict | None = None) -> dict:
    r = post(server, {"tool": tool, "params": params}, headers)
    assert r.status_code == 200, r.text
    assert "error" not in r.json(), r.text
    return r.json()


def call_error(server: Server, tool: str, params: dict, headers: dict | None = None) -> str:
    r = post(server, {"tool": tool, "params": params}, headers)
    assert r.status_code == 200, r.text
    return r.json()["error"]


def stream(server: Server, tool: str, params: dict, headers: dict | None = None) -> list[dict]:
    r = post(server, {"tool": tool, "params": params, "stream": True}, headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    return [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]


# -- the routes: off without the flags, behind the API key, CORS narrowed ----------------------

def test_without_the_flags_both_routes_answer_403_feature_disabled(built):
    s = built.plain
    for method, path in (("GET", "/tools"), ("POST", "/tools"), ("GET", "/cors-proxy"),
                         ("POST", "/cors-proxy")):
        r = httpx.request(method, f"{s.url}{path}", json={"tool": "get_info", "params": {}})
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["error"]["type"] == "feature_disabled"
        assert r.json()["error"]["message"] == "this feature is disabled"
    assert httpx.get(f"{s.url}/props").json()["cors_proxy_enabled"] is False
    assert httpx.get(f"{built.tools.url}/props", headers=AUTH).json()["cors_proxy_enabled"]
    # the routes are no part of the described API (the fuzzer must not run commands)
    assert "/tools" not in httpx.get(f"{s.url}/openapi.json").json()["paths"]


def test_the_routes_need_the_api_key(built, tmp_path):
    s, marker = built.tools, tmp_path / "ran"
    assert httpx.get(f"{s.url}/tools").status_code == 401
    r = httpx.post(f"{s.url}/tools", json={"tool": "exec_shell_command",
                                           "params": {"command": f"touch {marker}"}})
    assert r.status_code == 401 and not marker.exists()
    assert httpx.get(f"{s.url}/cors-proxy?url=http://127.0.0.1:9/").status_code == 401
    call(s, "exec_shell_command", {"command": f"touch {marker}"})
    assert marker.exists()


def preflight(server: Server, origin: str) -> httpx.Response:
    return httpx.options(f"{server.url}/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization"})


def test_with_tools_cors_defaults_to_localhost_only(built):
    r = preflight(built.tools, "http://localhost:8080")
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == \
        "http://localhost:8080"
    r = preflight(built.tools, "http://evil.com")
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
    # without --tools any origin is still allowed (the default '*')
    assert preflight(built.plain, "http://evil.com").headers["Access-Control-Allow-Origin"] == \
        "http://evil.com"
    log = built.tools.log()
    assert "security: MCP proxy (experimental), server tools (experimental) enabled" in log
    assert "using localhost as default CORS origin" in log


def test_get_tools_lists_every_tool_with_its_definition(built):
    r = httpx.get(f"{built.tools.url}/tools", headers=AUTH)
    assert r.status_code == 200
    tools = r.json()
    assert [t["tool"] for t in tools] == ["read_file", "file_glob_search", "grep_search",
                                          "exec_shell_command", "write_file", "edit_file",
                                          "get_info"]
    writes = {t["tool"] for t in tools if t["permissions"]["write"]}
    assert writes == {"exec_shell_command", "write_file", "edit_file"}
    for t in tools:
        fn = t["definition"]["function"]
        assert t["type"] == "server" and t["uses_cwd"] is True and t["display_name"]
        assert t["definition"]["type"] == "function" and fn["name"] == t["tool"]
        assert fn["parameters"]["type"] == "object"
    by = {t["tool"]: t["definition"]["function"]["parameters"] for t in tools}
    assert by["grep_search"]["required"] == ["path", "pattern"]
    assert by["edit_file"]["properties"]["edits"]["items"]["required"] == ["old_text", "new_text"]


def test_requests_that_are_not_a_tool_call(built):
    s = built.tools
    r = httpx.post(f"{s.url}/tools", content=b"{nope", headers=AUTH)
    assert r.status_code == 400
    assert post(s, {"params": {}}).status_code == 400
    r = post(s, {"tool": "rm_rf", "params": {}})
    assert r.status_code == 404 and 'unknown tool "rm_rf"' in r.json()["error"]["message"]
    r = post(s, {"tool": "read_file", "params": {"path": "x"}, "stream": True})
    assert r.status_code == 404 and "does not support stream" in r.text
    assert post(s, {"tool": "read_file", "params": {}}).status_code == 400  # no path


# -- the tools ---------------------------------------------------------------------------------

def test_grep_search(built, tmp_path):
    s = built.tools
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.py").write_text(f"one\n{MARK} = 1\nthree\n")
    (tmp_path / "b.txt").write_text(f"{MARK}\n")
    res = call(s, "grep_search", {"path": str(tmp_path), "pattern": MARK, "include": "a.py"})
    assert res["plain_text_response"] == f"sub/a.py:{MARK} = 1\n\n---\nTotal matches: 1\n"
    res = call(s, "grep_search", {"path": str(tmp_path), "pattern": "ONE", "ignore_case": True,
                                  "context_lines": 1})
    assert res["plain_text_response"].startswith(f"sub/a.py:1:one\nsub/a.py-2-{MARK} = 1\n--\n")
    res = call(s, "grep_search", {"path": str(tmp_path / "b.txt"), "pattern": "(", "literal":
                                  True})
    assert "Total matches: 0" in res["plain_text_response"]
    assert "invalid regex" in call_error(s, "grep_search", {"path": str(tmp_path),
                                                            "pattern": "("})
    assert "path does not exist" in call_error(s, "grep_search", {"path": str(tmp_path / "no"),
                                                                  "pattern": "x"})
    (tmp_path / "many.txt").write_text("hit\n" * 150)
    res = call(s, "grep_search", {"path": str(tmp_path), "pattern": "hit",
                                  "return_line_numbers": True})
    assert "many.txt:100:hit\n" in res["plain_text_response"]
    assert "many.txt:101:" not in res["plain_text_response"]
    assert "[100 matches limit reached." in res["plain_text_response"]


def test_read_file(built, tmp_path):
    s, f = built.tools, tmp_path / "f.txt"
    f.write_text("a\nb\nc\n")
    assert call(s, "read_file", {"path": str(f)})["plain_text_response"] == "a\nb\nc\n"
    res = call(s, "read_file", {"path": str(f), "start_line": 2, "end_line": 2,
                                "append_loc": True})
    assert res["plain_text_response"] == "2\u2192b\n"
    assert "cannot stat file" in call_error(s, "read_file", {"path": str(tmp_path / "no")})
    big = tmp_path / "big.txt"
    big.write_text("x" * 99 + "\n" * 1 + ("y" * 99 + "\n") * 300)
    assert "file too large" in call_error(s, "read_file", {"path": str(big)})
    text = call(s, "read_file", {"path": str(big), "end_line": 1000})["plain_text_response"]
    assert text.endswith("[output truncated]") and len(text) <= 16 * 1024 + 18
    r = post(s, {"tool": "read_file", "params": {"path": str(f)}}, {"x-resp-type": "base64"})
    assert r.json() == {"base64": base64.b64encode(b"a\nb\nc\n").decode(), "size_bytes": 6}


def test_write_then_edit_file(built, tmp_path):
    s, log = built.tools, str(tmp_path / "deep" / "test.log")
    res = call(s, "write_file", {"path": log, "content": "line1\nline2\nline3\n"})
    assert res == {"result": "file written successfully", "path": log, "bytes": 18}
    res = call(s, "edit_file", {"path": log, "edits": [
        {"old_text": "line2", "new_text": "line2-edited"},
        {"old_text": "line3\n", "new_text": "line3\nline4\n"}]})
    assert res["result"] == "file edited successfully" and res["edits_applied"] == 2
    assert open(log).read() == "line1\nline2-edited\nline3\nline4\n"


def test_edit_file_refusals(built, tmp_path):
    s, f = built.tools, tmp_path / "t.txt"
    f.write_text("dup\ndup\n")
    assert "unique" in call_error(s, "edit_file", {"path": str(f), "edits": [
        {"old_text": "dup", "new_text": "x"}]})
    f.write_text("line1\nline2\n")
    assert "overlap" in call_error(s, "edit_file", {"path": str(f), "edits": [
        {"old_text": "line1\nline2", "new_text": "a"}, {"old_text": "line2", "new_text": "b"}]})
    assert "could not find edits[0]" in call_error(s, "edit_file", {"path": str(f), "edits": [
        {"old_text": "nope", "new_text": "b"}]})
    assert "no changes made" in call_error(s, "edit_file", {"path": str(f), "edits": [
        {"old_text": "line1", "new_text": "line1"}]})
    assert "non-empty array" in call_error(s, "edit_file", {"path": str(f), "edits": []})
    assert "must not be empty" in call_error(s, "edit_file", {"path": str(f), "edits": [
        {"old_text": "", "new_text": "b"}]})
    assert f.read_text() == "line1\nline2\n"  # no refused edit wrote anything


def test_edit_file_fuzzy_match_keeps_the_other_lines_as_they_were(built, tmp_path):
    f = tmp_path / "q.txt"
    f.write_bytes("say \u201chi\u201d  \nkeep\u2014me   \n".encode())
    res = call(built.tools, "edit_file", {"path": str(f), "edits": [
        {"old_text": 'say "hi"', "new_text": 'say "bye"'}]})
    assert res["edits_applied"] == 1
    assert f.read_bytes() == 'say "bye"\nkeep\u2014me   \n'.encode()


def test_exec_shell_command(built, tmp_path):
    s = built.tools
    res = call(s, "exec_shell_command", {"command": "echo hello; echo oops >&2; exit 3"})
    assert res["plain_text_response"] == "hello\noops\n\n[exit code: 3]"
    res = call(s, "exec_shell_command", {"command": "yes | head -c 5000",
                                         "max_output_size": 100})
    assert res["plain_text_response"] == "y\n" * 50 + "\n[output truncated]\n[exit code: 0]"
    t0 = time.monotonic()
    res = call(s, "exec_shell_command", {"command": "echo start; sleep 30", "timeout": 1})
    assert time.monotonic() - t0 < 10
    assert res["plain_text_response"].startswith("start\n")
    assert res["plain_text_response"].endswith(" [exit due to timed out]")


def test_exec_shell_command_streams_chunks_then_done(built):
    events = stream(built.tools, "exec_shell_command", {"command": "echo hello; echo world"})
    assert len(events) >= 2 and events[-1] == {"done": True}
    text = "".join(e["chunk"] for e in events[:-1])
    assert text == "hello\nworld\n\n[exit code: 0]"
    # a failure once the stream has begun comes in the final event
    events = stream(built.tools, "exec_shell_command", {"command": "true"},
                    {"x-tool-runtime": "fake:x"})
    assert events[-1]["done"] is True and "unknown tool runtime" in events[-1]["error"]


def test_cwd_header(built, tmp_path):
    s, work = built.tools, tmp_path / "workdir"
    work.mkdir()
    (work / "rel.txt").write_text("relative-content")
    h = {"x-tool-cwd": str(work)}
    # a cwd from the model is dropped for the header's
    res = call(s, "read_file", {"path": "rel.txt", "cwd": "/definitely/not/here"}, h)
    assert res["plain_text_response"] == "relative-content\n"
    call(s, "write_file", {"path": "sub/out.txt", "content": "written"}, h)
    assert (work / "sub" / "out.txt").read_text() == "written"
    res = call(s, "file_glob_search", {"path": ".", "include": "*.txt"}, h)
    assert res["base"] == str(work) and {e["path"] for e in res["entries"]} == {
        "rel.txt", "sub/out.txt"}
    call(s, "exec_shell_command", {"command": "echo hi > made_here.txt"}, h)
    assert (work / "made_here.txt").exists()
    assert call(s, "get_info", {}, h)["cwd"] == str(work)
    info = call(s, "get_info", {"cwd": "/model/said"})
    assert info["cwd"] == os.getcwd() and info["os"].startswith("Linux")
    accented = tmp_path / "dossier-\u00e9t\u00e9"  # the header's bytes are UTF-8
    accented.mkdir()
    (accented / "f.txt").write_text("accented")
    res = call(s, "read_file", {"path": "f.txt"}, {"x-tool-cwd": str(accented).encode()})
    assert res["plain_text_response"] == "accented\n"
    (tmp_path / "abs.txt").write_text("absolute")
    res = call(s, "read_file", {"path": str(tmp_path / "abs.txt")}, h)
    assert res["plain_text_response"] == "absolute\n"


def test_file_glob_search(built, tmp_path):
    s = built.tools
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "top.txt").write_text("top")
    (tmp_path / "a" / "mid.txt").write_text("mid")
    (tmp_path / "a" / "b" / "deep.txt").write_text("deep")
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("built")
    res = call(s, "file_glob_search", {"path": str(tmp_path), "max_depth": 1})
    assert [e["path"] for e in res["entries"]] == ["top.txt"]
    res = call(s, "file_glob_search", {"path": str(tmp_path), "max_depth": 2})
    assert sorted(e["path"] for e in res["entries"]) == ["a/mid.txt", "top.txt"]
    res = call(s, "file_glob_search", {"path": str(tmp_path), "limit": 1})
    assert len(res["entries"]) == 1
    assert "Total matches: 3\n[1 results limit reached (3 total matches)." in \
        res["plain_text_response"]
    res = call(s, "file_glob_search", {"path": str(tmp_path), "type": "dir"})
    assert sorted(e["path"] for e in res["entries"]) == ["a", "a/b", "a/b/c", "build"]
    assert "a/b/\n" in res["plain_text_response"]  # directories end with '/'
    # a pattern with '/' matches at any depth, the top included
    res = call(s, "file_glob_search", {"path": str(tmp_path), "include": "a/*.txt"})
    assert [e["path"] for e in res["entries"]] == ["a/mid.txt"]
    res = call(s, "file_glob_search", {"path": str(tmp_path), "type": "all",
                                       "include": "a/**", "exclude": "*.txt"})
    assert sorted(e["path"] for e in res["entries"]) == ["a/b", "a/b/c"]
    assert "invalid type" in call_error(s, "file_glob_search", {"path": str(tmp_path),
                                                                "type": "bogus"})
    assert "invalid limit" in call_error(s, "file_glob_search", {"path": str(tmp_path),
                                                                 "limit": 0})
    assert "not a directory" in call_error(s, "file_glob_search", {"path": str(tmp_path / "z")})


def test_file_search_in_a_git_tree_leaves_out_ignored_files(built, tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "kept.py").write_text("x")
    (tmp_path / "noise.log").write_text(MARK)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "tracked.py").write_text(MARK)  # git lists it: not a walk
    res = call(built.tools, "file_glob_search", {"path": str(tmp_path)})
    assert sorted(e["path"] for e in res["entries"]) == [".gitignore", "build/tracked.py",
                                                         "kept.py"]
    res = call(built.tools, "grep_search", {"path": str(tmp_path), "pattern": MARK})
    assert "noise.log" not in res["plain_text_response"]
    assert "Total matches: 1" in res["plain_text_response"]


def test_bad_runtimes_are_500_and_never_run_on_the_host(built, tmp_path):
    s, marker = built.tools, tmp_path / "pwned"
    cmd = {"command": f"touch {marker}"}
    for runtime, message in (("fake:does-not-exist", "unknown tool runtime"),
                             (f"ssh:-oProxyCommand=touch {marker}", "invalid ssh target"),
                             ("docker-container:--privileged", "invalid container id"),
                             ("podman-container:-x", "invalid container id"),
                             ("docker:busybox", "must name a running container")):
        r = post(s, {"tool": "exec_shell_command", "params": cmd}, {"x-tool-runtime": runtime})
        assert r.status_code == 500 and message in r.json()["error"]["message"], r.text
    assert not marker.exists()


# -- the container runtime, with a stand-in docker --------------------------------------------

FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$FAKE_DOCKER_LOG"
if [ "$1" = run ]; then
  while [ "$1" != --cidfile ]; do shift; done
  echo fakecid123 > "$2"
  cat > /dev/null
  echo "container removed" >> "$FAKE_DOCKER_LOG"
  exit 0
fi
shift
[ "$1" = -i ] && shift
[ "$1" = fakecid123 ] || { echo "no such container: $1" >&2; exit 1; }
shift
exec "$@"
"""


def test_tools_runtime_container_is_started_used_and_removed(built, tmp_path):
    bin_dir, work, log = tmp_path / "bin", tmp_path / "work", tmp_path / "docker.log"
    bin_dir.mkdir()
    work.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_LOG": str(log)}
    s = Server(["--model", str(built.path), "--ctx-size", "256", "-t", "1", "--no-warmup",
                "--tools", "all", "--tools-runtime", "docker:someimage"], tmp_path / "s.log", env)
    try:
        s.wait_ready(120)
        assert log.read_text().startswith("run --rm -i --cidfile ")
        h = {"x-tool-cwd": str(work)}
        res = call(s, "write_file", {"path": "sub/out.txt", "content": f"{MARK}\n"}, h)
        assert res["bytes"] == len(MARK) + 1
        assert (work / "sub" / "out.txt").read_text() == f"{MARK}\n"
        assert call(s, "read_file", {"path": "sub/out.txt"}, h)["plain_text_response"] == \
            f"{MARK}\n"
        (work / "node_modules").mkdir()
        (work / "node_modules" / "dep.js").write_text("x")
        res = call(s, "file_glob_search", {"path": str(work), "type": "all"}, h)
        assert sorted(e["path"] for e in res["entries"]) == ["node_modules", "sub",
                                                             "sub/out.txt"]
        res = call(s, "grep_search", {"path": ".", "pattern": MARK}, h)
        assert f"sub/out.txt:{MARK}" in res["plain_text_response"]
        res = call(s, "edit_file", {"path": "sub/out.txt", "edits": [
            {"old_text": MARK, "new_text": "edited"}]}, h)
        assert (work / "sub" / "out.txt").read_text() == "edited\n"
        res = call(s, "exec_shell_command", {"command": "pwd"}, h)
        assert res["plain_text_response"] == f"{work}\n\n[exit code: 0]"
        assert call(s, "get_info", {}, {})["cwd"] == os.getcwd()  # `pwd` in the isolate
        calls = log.read_text()
        assert "exec -i fakecid123 timeout 10s sh -c pwd" not in calls  # cwd applied first
        assert f"exec -i fakecid123 sh -c cd \"$1\" || exit 127; shift; exec \"$@\" _ {work} " \
               "timeout 10s sh -c pwd" in calls
        assert "exec fakecid123 cat -- " in calls
        assert "security: server tools (experimental), tools runtime (experimental)" in s.log()
    finally:
        s.stop()
    assert log.read_text().rstrip().endswith("container removed")


def test_a_bad_tools_flag_stops_the_start(built):
    for args, message in ((["--tools", "read_file,bogus"], 'unknown tool "bogus"'),
                          (["--tools", "all", "--tools-runtime", "ssh:-oProxyCommand=x"],
                           "invalid ssh target"),
                          (["--tools", "all", "--tools-runtime", "docker:"],
                           "requires an image name"),
                          (["--tools", "all", "--tools-runtime", "lxc:x"],
                           "unknown tool runtime")):
        r = subprocess.run([*SERVE, "--model", str(built.path), "--port", "0", *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and message in r.stderr, (args, r.stderr)


# -- the agent extra: optional, never imported when off -----------------------------------

def test_a_plain_server_never_imports_the_agent_package(built):
    code = ("import sys\n"
            "sys.modules['wcmatch'] = None  # as where the extra is not installed\n"
            "from tandem.cli import build_parser\n"
            "from tandem.server import cli\n"
            "from tandem.server.app import create_app\n"
            "from tandem.server.state import ServerState\n"
            "a = build_parser().commands['serve'].parse_args(['--model', sys.argv[1]])\n"
            "create_app(ServerState(cli._settings(a)))\n"
            "print(sorted(m for m in sys.modules if m.startswith('tandem.agent')))\n")
    r = subprocess.run([sys.executable, "-c", code, str(built.path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


@pytest.mark.parametrize("flag", [["--tools", "all"], ["--ui-mcp-proxy"], ["--agent"]])
def test_without_the_agent_extra_serve_stops_at_once_naming_it(built, flag):
    code = ("import sys\n"
            "sys.modules['httpx'] = sys.modules['wcmatch'] = None  # the extra not installed\n"
            "from tandem.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", code, "serve", "--model", str(built.path),
                        "--port", "0", *flag], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "pip install 'tandem[agent]'" in r.stderr, r.stderr
    assert "listening" not in r.stderr


def test_glob_patterns():
    from tandem.agent.glob import path_glob_match as match

    assert match("*.py", "a/b/c.py") and not match("*.py", "a/b/c.pyc")  # the base name
    assert match("src/*.cpp", "src/a.cpp") and match("src/*.cpp", "x/src/a.cpp")
    assert not match("src/*.cpp", "src/sub/a.cpp") and match("src/**/*.cpp", "src/a/b/c.cpp")
    assert match("**", ".gitignore") and match("[!a]*", "b") and not match("[!a]*", "a")
    assert match("a\\b", "a\\b") and not match("a\\b", "ab")  # a backslash is itself


# -- the CORS proxy ----------------------------------------------------------------------------

class Target(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.seen.append(("GET", dict(self.headers), b""))
        if self.path == "/missing":
            self.send_response(404)
            self.end_headers()
            return
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/capture?after=redirect")
            self.end_headers()
            return
        body = f"ok {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("X-Target", "yes")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(("POST", dict(self.headers), body))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(3):  # no length: the answer is streamed until the connection closes
            self.wfile.write(f"data: {i}\n\n".encode())
            self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture
def target():
    t = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    t.seen = []
    threading.Thread(target=t.serve_forever, daemon=True).start()
    yield t
    t.shutdown()
    t.server_close()


def test_cors_proxy_forwards_only_the_explicit_proxy_headers(built, target):
    url = f"http://127.0.0.1:{target.server_port}"
    r = httpx.get(f"{built.tools.url}/cors-proxy?url={url}/capture", headers={
        "Authorization": f"Bearer {KEY}", "Proxy-Authorization": "Basic secret",
        "X-Api-Key": KEY, "Cookie": "session=secret",
        "x-llama-server-proxy-header-accept": "application/json",
        "x-llama-server-proxy-header-authorization": "Bearer explicit"})
    assert r.status_code == 200 and r.text == "ok /capture"
    assert r.headers["x-target"] == "yes" and r.headers["content-type"] == "text/plain"
    assert "access-control-allow-origin" not in r.headers  # the target's CORS is not ours
    method, headers, _ = target.seen[-1]
    seen = {k.lower(): v for k, v in headers.items()}
    assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
    for secret in ("proxy-authorization", "x-api-key", "cookie"):
        assert secret not in seen
    assert KEY not in json.dumps(seen)


def test_cors_proxy_post_body_status_and_redirects(built, target):
    s, url = built.tools, f"http://127.0.0.1:{target.server_port}"
    r = httpx.post(f"{s.url}/cors-proxy?url={url}/mcp", content=b'{"jsonrpc": "2.0"}',
                   headers={**AUTH, "x-llama-server-proxy-header-content-type":
                            "application/json"})
    assert r.status_code == 200 and r.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert r.headers["content-type"].startswith("text/event-stream")
    method, headers, body = target.seen[-1]
    assert method == "POST" and body == b'{"jsonrpc": "2.0"}'
    assert {k.lower(): v for k, v in headers.items()}["content-type"] == "application/json"
    assert httpx.get(f"{s.url}/cors-proxy?url={url}/missing", headers=AUTH).status_code == 404
    r = httpx.get(f"{s.url}/cors-proxy?url={url}/moved", headers=AUTH)
    assert r.status_code == 200 and r.text == "ok /capture?after=redirect"


def test_cors_proxy_refuses_bad_targets(built):
    s = built.tools
    for url, message in (("", "invalid URL: no scheme"),
                         ("ftp://example.com/", "unsupported URL scheme: ftp"),
                         ("http://user:pw@127.0.0.1/", "authentication in target URL"),
                         ("http://127.0.0.1:9/", "proxy error")):
        r = httpx.get(f"{s.url}/cors-proxy", params={"url": url}, headers=AUTH, timeout=30)
        assert r.status_code == 500 and message in r.json()["error"]["message"], r.text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
