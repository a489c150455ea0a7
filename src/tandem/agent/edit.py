"""edit_file's text replacement, as llama-server's: every edits[i].old_text is found in the
file's original content (not after the edits before it), must occur once, and no two edits may
overlap. An old_text that is not found exactly is looked for again with both sides normalized
line by line (trailing blanks dropped; curly quotes, dashes and odd spaces made ASCII); the
lines such an edit does not touch are then written back exactly as they were."""

from __future__ import annotations

from dataclasses import dataclass


class EditError(Exception):
    """Why the edits were not applied: the tool answers {"error": message}."""


_FUZZY = {**{c: "'" for c in range(0x2018, 0x201C)},  # curly single quotes
          **{c: '"' for c in range(0x201C, 0x2020)},  # curly double quotes
          **{c: "-" for c in range(0x2010, 0x2016)}, 0x2212: "-",  # dashes, minus
          0x00A0: " ", **{c: " " for c in range(0x2002, 0x200B)},  # no-break, en ... hair
          0x202F: " ", 0x205F: " ", 0x3000: " "}


def normalize(text: str) -> str:
    """Line by line (the line count and order stay): trailing spaces, tabs and CRs dropped,
    typographic quotes, dashes and spaces made ASCII."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in text.split("\n"))


def _count(text: str, needle: str) -> int:
    """Occurrences that do not overlap."""
    return text.count(needle) if needle else 0


@dataclass
class _Match:
    at: int  # offset in the base text (the original, or its normalized form)
    length: int
    index: int  # which edit
    new_text: str


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str:
    """The file's new content, or EditError with llama-server's message."""
    norm_original = normalize(original)
    fuzzy = False
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if normalize(old) not in norm_original:
            raise EditError(f"could not find edits[{i}].old_text in {path}, it must match the "
                            "file's current content exactly")
        fuzzy = True
    base = norm_original if fuzzy else original
    matches = []
    for i, (old, new) in enumerate(edits):
        needle = normalize(old) if fuzzy else old
        # uniqueness is judged on normalized text: a copy differing in blanks still counts
        n = _count(norm_original, normalize(old))
        if n > 1:
            raise EditError(f"found {n} occurrences of edits[{i}].old_text in {path}, it must "
                            "be unique")
        matches.append(_Match(base.find(needle), len(needle), i, new))
    matches.sort(key=lambda m: m.at)
    for a, b in zip(matches, matches[1:]):
        if a.at + a.length > b.at:
            raise EditError(f"edits[{a.index}] and edits[{b.index}] overlap in {path}; merge "
                            "them into one edit or target disjoint regions")
    out = _keep_untouched_lines(original, base, matches) if fuzzy else _replace(base, matches)
    if out == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return out


def _replace(text: str, matches: list[_Match], offset: int = 0) -> str:
    """`matches` sorted and disjoint; their offsets are `offset` past the start of `text`."""
    for m in reversed(matches):
        at = m.at - offset
        text = text[:at] + m.new_text + text[at + m.length:]
    return text


def _split(text: str) -> list[str]:
    """Lines, each with its '\\n' (the last one may have none); nothing for ''."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _keep_untouched_lines(original: str, base: str, matches: list[_Match]) -> str:
    """Apply the matches (offsets in `base`, the normalized text) to the lines they touch;
    every other line comes from `original` untouched."""
    spans, at = [], 0
    for line in _split(base):
        spans.append((at, at + len(line)))
        at += len(line)
    groups: list[list] = []  # [first line, end line (exclusive), matches]
    for m in matches:
        first = next((i for i, (s, e) in enumerate(spans) if s <= m.at < e), None)
        if first is None:  # an empty needle at the very end: nothing to keep apart
            return _replace(base, matches)
        last = first
        while last < len(spans) and spans[last][1] < m.at + m.length:
            last += 1
        if last >= len(spans):
            return _replace(base, matches)
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last + 1)
            groups[-1][2].append(m)
        else:
            groups.append([first, last + 1, [m]])
    kept = _split(original)
    out, done = [], 0
    for first, end, group in groups:
        out += kept[done:first]
        start, stop = spans[first][0], spans[end - 1][1]
        out.append(_replace(base[start:stop], group, start))
        done = end
    out += kept[done:]
    return "".join(out)
