"""The glob patterns of the agent tools' file_glob_search and grep_search (include,
exclude), as llama.cpp's glob_match: `*` any run of characters but '/', `**` any run at all,
`?` one character but '/', `[a-z]` / `[!a-z]` a class; everything else literally. One
difference: `**/` may also match no folder at all, so "src/*.cpp" (searched as "**/src/*.cpp")
finds src/a.cpp at the top too, as the tools' descriptions promise (llama.cpp's own code
needs a '/' before "src" there, so it never matches at the top)."""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern:
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):  # any folders, none included ("**/x" matches "x")
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = i + 1
            if end < n and pattern[end] in "]-":  # a leading ] or - is a member
                end += 1
            end = pattern.find("]", end)
            if end < 0:  # no closing bracket: a plain '['
                out.append(re.escape(c))
                i += 1
            else:
                out.append(_glob_class(pattern[i + 1:end]))
                i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _glob_class(body: str) -> str:
    negated = body.startswith("!")
    body = body[1:] if negated else body
    items, j = [], 0
    if body[:1] in ("]", "-") and body:
        items.append(re.escape(body[0]))
        j = 1
    while j < len(body):
        if j + 2 < len(body) and body[j + 1] == "-" and body[j + 2] != "]":
            if body[j] <= body[j + 2]:  # a reversed range matches nothing
                items.append(f"{re.escape(body[j])}-{re.escape(body[j + 2])}")
            j += 3
        else:
            items.append(re.escape(body[j]))
            j += 1
    if not items:
        return "." if negated else "(?!)"
    return f"[{'^' if negated else ''}{''.join(items)}]"


def glob_match(pattern: str, text: str) -> bool:
    return _glob_regex(pattern).fullmatch(text) is not None


def path_glob_match(pattern: str, rel: str) -> bool:
    """No '/' in the pattern: it matches the base name at any depth. With one: the whole
    relative path, "**/" put in front unless it starts with "**/" or "/" (or is "**")."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)
