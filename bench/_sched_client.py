"""A Python client of bench/device_sched.cu (SCHED_CLIENT=python): the prototype's C client
loop, in Python, as accy's clients would run it. Arguments (given by device_sched): the
shared memory's descriptor, this client's index, warm-up and timed seconds, then the
offsets of the ticket words, the done words and their stride, ``go``, ``gave_up``, the
counts and the histograms, the histogram's buckets (1 µs each), and how long to wait for
``go`` (the GPU's process sets it once ready)."""

from __future__ import annotations

import mmap
import os
import sys
import time


def main(argv: list[str]) -> int:
    fd, index = int(argv[0]), int(argv[1])
    warm, seconds = float(argv[2]), float(argv[3])
    tickets, dones, stride, go, gave_up, counts, hists, buckets = map(int, argv[4:12])
    go_wait = float(argv[12])
    memory = mmap.mmap(fd, 0)
    words = memoryview(memory).cast("I")  # every offset is a multiple of 4
    longs = memoryview(memory)[counts : counts + 8 * 64].cast("q")
    ticket = tickets // 4 + index
    done = (dones + stride * index) // 4
    hist = hists // 4 + index * buckets
    asked = time.perf_counter()
    while not words[go // 4]:
        os.sched_yield()
        if time.perf_counter() - asked > go_wait:
            words[gave_up // 4] += 1
            return 1
    seq = words[ticket]
    now = time.perf_counter
    yield_ = os.sched_yield
    start = now()
    timed_from, end = start + warm, start + warm + seconds
    count = 0
    while True:
        began = now()
        if began >= end:
            break
        seq += 1
        words[ticket] = seq
        while words[done] < seq:
            yield_()
            if now() - began > 2.0:
                words[gave_up // 4] += 1  # racy between clients, but any count says it
                longs[index] = count
                return 1
        if began >= timed_from:
            us = int((now() - began) * 1e6)
            words[hist + min(us, buckets - 1)] += 1
            count += 1
    longs[index] = count
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
