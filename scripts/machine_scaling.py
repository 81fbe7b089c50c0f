"""What a second thread gives on this machine, for code that shares nothing: the yardstick for
bench_encode.py's "2 threads / 1 thread" ratios.

    python scripts/machine_scaling.py [--repeat 7] [--scale 1.0] [--json out.json]

Each workload is a small Numba loop that releases the GIL and touches only its own memory. It
runs once on one thread, then the same work on each of two threads at once (started together);
the speedup is 2 x (one thread's time) / (two threads' time): 2.00 if the second CPU is a whole
core of its own, less if the two share one (hyperthreads, or a host that runs both virtual CPUs
on one core part of the time) or share the memory's bandwidth. Best of `--repeat` runs each,
the two alternated. `--scale` multiplies the work of each (and the largest table's size).

- dependent chain: one multiply-add after another, each waiting for the last (the latency of
  the arithmetic: two hyperthreads of one core overlap such chains almost perfectly);
- arithmetic over 32 KB: multiply-adds over an array in the core's L1 cache, four sums at a
  time (still bound by the adds' latency, so hyperthreads would overlap these too);
- integer work, 64 lanes: an xor and an add on each of 64 independent lanes a step, enough
  independent work to keep the core's units busy rather than waiting on a result: the workload
  that tells a core of its own (2.00x) from hyperthreads of one, which would share the units
  (towards 1x);
- random reads in 1 MB (in the core's L2 cache), in 8 MB (the size of nbbpe's pre-token cache
  with GPT-2's files) and in 256 MB (mostly from memory): addresses from a chain of multiplies,
  as the encode loop's lookups are;
- random reads in 16 MB, 32 at a time: the addresses of 32 reads computed first, then the 32
  read, so that many misses are in flight at once, as the encode loop's prefetched window of
  lookups has them (what the memory and the shared cache give two cores at once);
- streaming writes: a 64 MB array filled again and again (the memory's bandwidth).

The machine of this project: 2 virtual CPUs of an Intel Xeon VM (see PERFORMANCE.md's figures).
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
from numba import njit


@njit(nogil=True)  # not cached: this script is also loaded as a module of another name (tests)
def dependent_chain(n):
    x = np.uint64(1)
    for _ in range(n):  # the shift keeps the compiler from folding the steps together
        x = x * np.uint64(6364136223846793005) + (x >> np.uint64(29))
    return x


@njit(nogil=True)  # not cached: this script is also loaded as a module of another name (tests)
def array_arithmetic(a, passes):
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for _ in range(passes):
        for i in range(0, a.shape[0], 4):
            s0 += a[i] * 1.0001
            s1 += a[i + 1] * 0.9999
            s2 += a[i + 2] * 1.0002
            s3 += a[i + 3] * 0.9998
    return s0 + s1 + s2 + s3


@njit(nogil=True)  # not cached: this script is also loaded as a module of another name (tests)
def random_reads(table, n, seed):
    x = np.uint64(seed)
    mask = np.uint64(table.shape[0] - 1)
    total = np.int64(0)
    for _ in range(n):
        x = x * np.uint64(6364136223846793005) + np.uint64(1442695040888963407)
        total += table[(x >> np.uint64(20)) & mask]
    return total


@njit(nogil=True)  # not cached: this script is also loaded as a module of another name (tests)
def integer_lanes(n):
    lanes = np.zeros(64, dtype=np.uint64)
    for i in range(n):
        k = np.uint64(i)
        for j in range(64):  # 64 independent lanes: more work a step than the units do at once
            lanes[j] = (lanes[j] ^ k) + np.uint64(j)
    return lanes.sum()


@njit(nogil=True)  # not cached: this script is also loaded as a module of another name (tests)
def batched_reads(table, n, seed, addresses):
    x = np.uint64(seed)
    mask = np.uint64(table.shape[0] - 1)
    total = np.int64(0)
    for _ in range(n // addresses.shape[0]):
        for j in range(addresses.shape[0]):
            x = x * np.uint64(6364136223846793005) + np.uint64(1442695040888963407)
            addresses[j] = (x >> np.uint64(20)) & mask
        for j in range(addresses.shape[0]):
            total += table[addresses[j]]
    return total


@njit(nogil=True)  # not cached: this script is also loaded as a module of another name (tests)
def streaming_writes(array, passes):
    for p in range(passes):
        for i in range(array.shape[0]):
            array[i] = p + i
    return array[0]


def timed(function, args_per_thread) -> float:
    """Seconds from starting the threads (one per tuple of arguments) to the last one's end."""
    start = threading.Barrier(len(args_per_thread) + 1)

    def run(args):
        start.wait()
        function(*args)

    threads = [threading.Thread(target=run, args=(args,)) for args in args_per_thread]
    for thread in threads:
        thread.start()
    start.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - t0


def workloads(scale: float = 1.0) -> list:
    """(name, function, arguments of thread 0, arguments of thread 1): each thread its own memory."""
    def steps(n: int) -> int:
        return max(1, int(n * scale))

    largest = 1 << max(20, min(28, (int(256 * scale) << 20).bit_length() - 1))
    tables = {size: [np.arange(size // 8, dtype=np.int64) for _ in range(2)]
              for size in (1 << 20, 8 << 20, largest)}
    arrays = [np.zeros(8 << 20, dtype=np.int64) for _ in range(2)]
    small = [np.ones(4096) for _ in range(2)]
    result = [("dependent chain", dependent_chain, (steps(100_000_000),), (steps(100_000_000),)),
              ("arithmetic over 32 KB", array_arithmetic, (small[0], steps(20_000)),
               (small[1], steps(20_000)))]
    result.append(("integer work, 64 lanes", integer_lanes, (steps(10_000_000),),
                   (steps(10_000_000),)))
    for size, (first, second) in tables.items():
        result.append((f"random reads in {size >> 20} MB", random_reads,
                       (first, steps(20_000_000), 1), (second, steps(20_000_000), 2)))
    batched = [np.arange((16 << 20) // 8, dtype=np.int64) for _ in range(2)]
    result.append(("random reads in 16 MB, 32 at a time", batched_reads,
                   (batched[0], steps(10_000_000), 1, np.empty(32, dtype=np.int64)),
                   (batched[1], steps(10_000_000), 2, np.empty(32, dtype=np.int64))))
    result.append(("streaming writes, 64 MB", streaming_writes, (arrays[0], steps(8)),
                   (arrays[1], steps(8))))
    return result


def measure(repeat: int = 7, scale: float = 1.0, log=print) -> list[dict]:
    """The rows of the table: each workload's best times on one and two threads, and speedup."""
    rows = []
    for name, function, first, second in workloads(scale):
        function(*first)  # compile (or load), and touch both threads' memory, outside the clock
        function(*second)
        one, two = [], []
        for _ in range(repeat):
            one.append(timed(function, [first]))
            two.append(timed(function, [first, second]))
        speedup = 2 * min(one) / min(two)
        rows.append({"workload": name, "one_thread_s": min(one), "two_threads_s": min(two),
                     "speedup": speedup})
        log(f"{name:28s} 1 thread {min(one):.3f} s, 2 threads (the same work each) "
            f"{min(two):.3f} s: {speedup:.2f}x")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = measure(args.repeat, args.scale, log=lambda line: print(line, flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
