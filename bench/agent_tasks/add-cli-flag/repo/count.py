"""Count the lines of a text file: python count.py FILE"""

import argparse


def count_lines(text: str) -> int:
    return len(text.splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Count the lines of a text file.")
    parser.add_argument("file", help="the file to read")
    args = parser.parse_args(argv)
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    print(count_lines(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
