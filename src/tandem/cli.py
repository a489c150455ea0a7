"""`tandem`: the command line. It only dispatches: each command's flags and work live in its
own module, and the flags they share in flags.py."""

from __future__ import annotations

import os
import sys

from . import check, generate, registry
from .errors import TandemError
from .flags import Parser
from .measure import bench, compare
from .server import cli as serve
from .server import envargs
from .train import cli as train_head

COMMANDS = (  # name, module with add_arguments(parser) and run(args) -> exit code, help
    ("generate", generate, "generate text from a prompt"),
    ("models", registry, "pull or list the named default models"),
    ("check", check, "compatibility verdict and memory plan for a target/draft"),
    ("serve", serve, "serve the HTTP API (llama-server's flags)"),
    ("compare", compare, "compare two benchmark JSON files (equal work)"),
    ("bench", bench, "serve target alone, then speculation; compare (equal work)"),
    ("train-head", train_head, "train an EAGLE-3 draft head for a target"),
)


def build_parser() -> Parser:
    p = Parser(prog="tandem", description="Speculative decoding for local LLMs.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    p.commands = {}
    for name, module, help_ in COMMANDS:
        sp = sub.add_parser(name, help=help_)
        module.add_arguments(sp)
        sp.set_defaults(func=module.run)
        p.commands[name] = sp
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    env_used: list[str] = []
    if argv and argv[0] == "serve":  # llama-server's LLAMA_ARG_* variables, the command line first
        words, env_used = envargs.env_argv(parser.commands["serve"], argv[1:], os.environ)
        args = parser.parse_args(["serve", *words, *argv[1:]])
    else:
        args = parser.parse_args(argv)
    args.argv = ["tandem", *argv]
    args.env_used = env_used
    try:
        return int(args.func(args) or 0)
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
