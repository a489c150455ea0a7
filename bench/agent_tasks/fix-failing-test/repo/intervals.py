"""Closed integer intervals [start, end]."""


def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:
    """Merge overlapping or touching intervals; the result is sorted by start."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def total_length(intervals: list[list[int]]) -> int:
    """The number of integers covered by the intervals, each counted once."""
    return sum(end - start + 1 for start, end in merge_intervals(intervals))
