"""Token states of the exact memory (shared with the compiled drive)."""

FREE, RESERVE, MARGIN, ERROR, DRIVEN = 0, 1, 2, 3, 4
