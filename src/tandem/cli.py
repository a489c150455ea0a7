"""`tandem`: the command line. It only dispatches: each command's flags and work live in its
own module, and the flags they share in flags.py."""

from __future__ import annotations

import sys

from . import check, generate, registry
from .errors import TandemError
from .flags import Parser
from .measure import bench, compare
from .server import cli as serve

COMMANDS = (  # name, module with add_arguments(parser) and run(args) -> exit code, help
    ("generate", generate, "generate text from a prompt"),
    ("models", registry, "pull or list the named default models"),
    ("check", check, "compatibility verdict and memory plan for a target/draft"),
    ("serve", serve, "serve the HTTP API (llama-server's flags)"),
    ("compare", compare, "compare two benchmark JSON files (equal work)"),
    ("bench", bench, "serve target alone, then speculation; compare (equal work)"),
)


def build_parser() -> Parser:
    p = Parser(prog="tandem", description="Speculative decoding for local LLMs.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, module, help_ in COMMANDS:
        sp = sub.add_parser(name, help=help_)
        module.add_arguments(sp)
        sp.set_defaults(func=module.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = ["tandem", *(sys.argv[1:] if argv is None else argv)]
    try:
        return int(args.func(args) or 0)
    except TandemError as e:
        print(f"tandem: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
