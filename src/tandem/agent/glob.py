"""The glob patterns of the tools' file_glob_search and grep_search (include, exclude), matched
by wcmatch with bash's globstar: `*` any run of characters but '/', `**` as a whole path part
any run of folders (none included: "**/x" matches "x"), `?` one character but '/', `[a-z]` /
`[!a-z]` a class; dot files match like any other. A backslash is a plain character, as in
llama.cpp's glob_match. One difference from it: `**` inside a part ("src/**.py") is `*`, as in
bash, git and Python's glob, where llama.cpp's would cross folders."""

from __future__ import annotations

from wcmatch import glob

FLAGS = glob.GLOBSTAR | glob.DOTGLOB | glob.FORCEUNIX


def path_glob_match(pattern: str, rel: str) -> bool:
    """No '/' in the pattern: it matches the base name at any depth. With one: the whole
    relative path, "**/" put in front unless it starts with "**/" or "/" (or is "**")."""
    pattern = pattern.replace("\\", "\\\\")  # no escapes: a backslash is itself
    if "/" not in pattern:
        return glob.globmatch(rel.rsplit("/", 1)[-1], pattern, flags=FLAGS)
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob.globmatch(rel, pattern, flags=FLAGS)
    return glob.globmatch(rel, "**/" + pattern, flags=FLAGS)
