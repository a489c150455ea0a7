"""docs/flags.md, written from the flags' own metadata (`config.flag` on each setting's field):
every flag of `tandem generate`, `check`, `serve` and `bench` that a setting defines, with its
aliases, off spellings, LLAMA_ARG_* variables, default, allowed values and help, and the flags
`tandem serve` accepts with no effect, each with the reason.

    python -m tandem.flagsdoc > docs/flags.md

tests/test_config.py fails when docs/flags.md is not what this writes now.
"""

from __future__ import annotations

import argparse
import sys

from . import check, generate
from .flags import Parser
from .measure import bench
from .server import cli as serve

COMMANDS = (("generate", generate), ("check", check), ("serve", serve), ("bench", bench))


def render() -> str:
    out = ["# Flags", "",
           "Written by `python -m tandem.flagsdoc > docs/flags.md` from each setting's field "
           "(`config.flag`); a test fails when this file is not current.", "",
           "`tandem serve` also reads llama-server's LLAMA_ARG_* variables: each gives its "
           "flag's value where the command line does not, and LLAMA_ARG_NO_X turns switch X "
           "off.", ""]
    for name, module in COMMANDS:
        parser = Parser(prog=f"tandem {name}")
        module.add_arguments(parser)
        out += [f"## tandem {name}", ""]
        env = name == "serve"  # the variables are read by `tandem serve` alone
        for group in parser._action_groups:
            rows = [_row(a, env) for a in group._group_actions if hasattr(a, "meta")]
            if rows:
                head = ["flag", *(["variable"] if env else []), "default", "meaning"]
                out += [f"### {group.title}", "", "| " + " | ".join(head) + " |",
                        "|" + " --- |" * len(head), *rows, ""]
    return "\n".join(out)


def _row(action: argparse.Action, with_env: bool) -> str:
    meta = action.meta
    names = ", ".join(f"`{n}`" for n in meta["flags"])
    if meta["off"]:
        names += (", off: " if names else "") + ", ".join(f"`{n}`" for n in meta["off"])
    meaning = meta["help"]
    if meta["choices"]:
        meaning += f" (one of: {', '.join(meta['choices'])})"
    if meta["const"] is not None:
        meaning += f" (alone: {meta['const']})"
    default = "" if action.default is None else f"`{action.default}`"
    cells = (names, *([", ".join(meta["env"])] if with_env else []), default, meaning)
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.stdout.write(render())
