#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_alloc (tests/fuzz/corpus/): one small
program per kind of operation, in the input format described at the top of
fuzz_alloc.c. Run from anywhere; the files are committed, so this is only
needed when the format changes."""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def size(cls, v):
    return bytes([cls]) + struct.pack("<H", v & 0xFFFF)


def malloc(cls, v):
    return bytes([0]) + size(cls, v)


def calloc(cls, v, n):
    return bytes([3]) + size(cls, v) + bytes([n])


def realloc(pick, cls, v):
    return bytes([4]) + struct.pack("<H", pick) + size(cls, v)


def aligned(align_byte, cls, v, posix=False):
    return bytes([7 if posix else 6, align_byte]) + size(cls, v)


def free(pick, how=0):  # 0 free, 1 free_sized, 2 second thread, 3 realloc to 0
    return bytes([8 + (how and how + 1)]) + struct.pack("<H", pick)


def invalid(sub, v=0):
    return bytes([13, sub]) + struct.pack("<H", v)


def rewrite(pick):
    return bytes([14]) + struct.pack("<H", pick)


def tick(reclaim):
    return bytes([15, 0 if reclaim else 1])


seeds = {
    "small_churn": b"".join(
        [malloc(1 + i % 7, i * 37) for i in range(40)]
        + [free(i * 7, i % 3) for i in range(20)]
        + [calloc(5, 300 + i, 1 + i % 4) for i in range(8)]
        + [rewrite(i) for i in range(5)]
        + [tick(False)]
    ),
    "realloc_chain": b"".join(
        [malloc(1, 100)]
        + [realloc(0, c, v) for c, v in [(5, 1500), (9, 20000), (10, 9000), (11, 3000),
                                         (12, 50000), (7, 700), (0, 3), (12, 2000)]]
        + [free(0, 1)]
    ),
    "aligned": b"".join(
        [aligned(a, 5 + a % 8, 1000 + a * 100, posix=a % 2 == 1) for a in range(0, 16)]
        + [aligned(12, 11, 400), aligned(20, 8, 100)]
        + [free(i, 1) for i in range(10)]
    ),
    "huge": b"".join(
        [malloc(0xFE, 1000), malloc(0xFE, 60000), malloc(12, 30000)]
        + [realloc(0, 0xFE, 40000), free(1, 2), tick(True), free(0, 1), tick(True)]
    ),
    "large_spans": b"".join(
        [malloc(11, v) for v in (0, 800, 1600, 20000, 60000)]
        + [malloc(13, 0), malloc(13, 4), malloc(10, 65535)]
        + [free(1, 2), free(3, 0), tick(True), malloc(11, 100), realloc(0, 12, 65535)]
    ),
    "invalid": b"".join([invalid(s, 77) for s in range(6)] + [malloc(1, 10), free(0, 3)]),
    "remote": b"".join(
        [malloc(1 + i % 9, i * 101) for i in range(60)] + [free(i, 2) for i in range(60)]
        + [tick(False), tick(True)]
    ),
}

os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {OUT}")
