"""llama-server's environment variables (LLAMA_ARG_*): a flag's value from the environment.

Each variable is named once, on its setting's field (`config.flag(..., env=...)`), and
flags.add_config_args hands it to the flag's parser action. As llama-server reads them
(common/arg.cpp): a variable gives its flag's value when the command line does not set it (the
command line wins); a flag that takes no value is set by a truthy value (1, true, on, enabled)
and, where it has a negative spelling (--no-slots), unset by a falsey one (0, false, off,
disabled); LLAMA_ARG_NO_X gives --x's falsey value. Only the variables of flags that `tandem
serve` takes are read; each one used is logged by `run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping

TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")


def variables(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(variable, action) for every LLAMA_ARG_* variable the parser's flags name, in the
    parser's order."""
    for action in parser._actions:
        for env in getattr(action, "env", ()):
            yield env, action


def env_argv(parser: argparse.ArgumentParser, argv: list[str],
             environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The command-line words the environment adds in front of argv (argv, read after them,
    wins), and a log line per variable used. A variable whose flag's destination argv already
    sets is left out. A bad boolean value is a parser error naming the variable."""
    known = parser._option_string_actions
    given = {known[w.split("=", 1)[0]].dest for w in argv if w.split("=", 1)[0] in known}
    words: list[str] = []
    used: list[str] = []
    for env, action in variables(parser):
        flag = next(s for s in action.option_strings if s.startswith("--"))
        negative = action.negative
        neg_env = env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)
        if negative and neg_env in environ:
            env, value, shown = neg_env, "0", environ[neg_env]
        elif env in environ:
            value = shown = environ[env]
        else:
            continue
        if action.dest in given:
            used.append(f"{env} ignored: the command line sets {flag}")
            continue
        added = _words(parser, action, flag, env, value)
        words += added
        shown = "***" if "KEY" in env else shown
        used.append(f"{env}={shown}: {' '.join(a.split('=')[0] for a in added) or 'nothing'}")
    return words, used


def _words(parser: argparse.ArgumentParser, action: argparse.Action, flag: str, env: str,
           value: str) -> list[str]:
    if action.nargs != 0:  # a flag with a value
        return [f"{flag}={value}"]
    if value.lower() in TRUTHY:
        return [flag]
    if value.lower() in FALSEY:
        return [action.negative] if action.negative else []
    parser.error(f"environment variable {env}={value!r}: expected one of "
                 f"{', '.join(TRUTHY + FALSEY)}")
    return []
