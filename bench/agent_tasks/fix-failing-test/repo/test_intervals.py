from intervals import merge_intervals, total_length


def test_overlapping_intervals_merge():
    assert merge_intervals([[1, 4], [3, 6]]) == [[1, 6]]


def test_unsorted_input():
    assert merge_intervals([[8, 9], [1, 2]]) == [[1, 2], [8, 9]]


def test_touching_intervals_merge():
    assert merge_intervals([[1, 2], [2, 5]]) == [[1, 5]]


def test_total_length():
    assert total_length([[1, 3], [3, 4], [10, 10]]) == 5
