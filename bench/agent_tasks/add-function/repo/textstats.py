"""Small statistics about a piece of text."""


def word_count(text: str) -> int:
    """The number of whitespace-separated words in `text`."""
    return len(text.split())


def line_count(text: str) -> int:
    """The number of lines in `text`; a last line without a newline counts too."""
    return len(text.splitlines())


def longest_word(text: str) -> str:
    """The longest word in `text` (the first one on a tie), or "" when there is none."""
    best = ""
    for word in text.split():
        if len(word) > len(best):
            best = word
    return best
