from textstats import average_word_length


def test_average_word_length():
    assert average_word_length("a bcd") == 2.0
    assert average_word_length("  hello   world ") == 5.0
    assert isinstance(average_word_length("ab"), float)


def test_average_word_length_empty():
    assert average_word_length("") == 0.0
    assert average_word_length("   ") == 0.0
