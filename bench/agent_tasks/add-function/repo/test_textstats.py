from textstats import line_count, longest_word, word_count


def test_word_count():
    assert word_count("the quick  brown fox") == 4
    assert word_count("") == 0


def test_line_count():
    assert line_count("a\nb\nc") == 3
    assert line_count("a\nb\n") == 2


def test_longest_word():
    assert longest_word("a bb ccc dd") == "ccc"
    assert longest_word("") == ""
