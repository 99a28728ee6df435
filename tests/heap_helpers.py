"""Reading this process's own memory for copies of a byte string (the residue tests)."""

from __future__ import annotations

import os
import sys

import pytest

needs_proc_mem = pytest.mark.skipif(
    not os.access("/proc/self/mem", os.R_OK),
    reason="needs Linux's /proc/self/mem to read the process's memory")


def copies_in_process_memory(needle: bytes) -> int:
    """How many times ``needle`` occurs in this process's writable heap and anonymous
    memory (live and freed blocks alike), not counting the needle's own bytes.

    The scan reads through one anonymous mapping made after the list of mappings is
    taken (so it is not scanned itself), zeroed and unmapped at the end: reading into
    ``bytes`` objects would leave copies of the heap, needle included, in freed memory
    that a later scan would count.
    """
    import mmap

    own = id(needle) + sys.getsizeof(b"") - 1  # where CPython keeps a bytes object's data
    with open("/proc/self/maps") as fh:
        maps = fh.read().splitlines()
    step, hits = 1 << 22, 0
    buf = mmap.mmap(-1, step + len(needle))
    try:
        with open("/proc/self/mem", "rb", 0) as mem:
            for line in maps:
                parts = line.split()
                if "rw" not in parts[1] or (len(parts) > 5 and parts[5] != "[heap]"):
                    continue  # read-only, or a file's or the stack's mapping
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                for start in range(lo, hi, step):
                    size = min(step + len(needle) - 1, hi - start)
                    try:
                        mem.seek(start)
                        got = mem.readinto(memoryview(buf)[:size])
                    except (OSError, ValueError, OverflowError):
                        break
                    at = buf.find(needle, 0, got or 0)
                    while at >= 0:  # a match in the overlap is counted by its chunk only
                        hits += start + at != own and at < step
                        at = buf.find(needle, at + 1, got)
    finally:
        buf[:] = bytes(len(buf))
        buf.close()
    return hits
