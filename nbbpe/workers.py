"""The local worker pool: threads of this process running a stage's work on units of work.

The compiled kernels release the GIL, so threads share the tokenizer's tables and a worker's
results without copying or pickling, and start at once. Two shapes of work cover every stage:

- `accumulate`: each worker keeps a state (e.g. a table of counted pre-tokens) that it adds
  units to, then the workers' states are combined once (training);
- `map`: a function of each unit, results handed back in the units' order with a bounded number
  running ahead of the next one (encoding into a file written in order).

`nbbpe.distributed.DaskExecutor` offers the same two methods on a Dask cluster, so every stage
runs unchanged on either. Failures never hang and are never lost: the first error (in the order
of the units) is raised in the caller once the other workers have stopped.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def default_num_workers() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def check_num_workers(num_workers: int | None) -> int:
    if num_workers is None:
        return default_num_workers()
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive integer, got {num_workers!r}")
    return num_workers


class LocalExecutor:
    """Runs units of work on `num_workers` threads (default: one per CPU)."""

    def __init__(self, num_workers: int | None = None):
        self.num_workers = check_num_workers(num_workers)

    def accumulate(self, make_state: Callable[[], Any], units: Iterable, combine: Callable,
                   progress: Callable[[int], object] | None = None):
        """`combine([state.finish() for each worker])`, where each worker's state is
        `make_state()` and every unit is given to one worker's `state.add(unit)` (which returns
        an amount of work done, for `progress`). `units` may be an iterator: it is read once,
        lazily, so memory stays bounded."""
        source = _SharedIterator(units)
        stop = threading.Event()
        failures: list[tuple[int, BaseException]] = []
        finals: list = []
        lock = threading.Lock()

        def work() -> None:
            index = -1
            try:
                state = make_state()
                while not stop.is_set():
                    item = source.next()
                    if item is None:
                        break
                    index, unit = item
                    done = state.add(unit)
                    if progress is not None:
                        with lock:
                            progress(done)
                final = state.finish()
                with lock:
                    finals.append(final)
            except BaseException as exc:  # every failure is reported, the first in unit order
                with lock:
                    failures.append((index, exc))
                stop.set()

        if self.num_workers == 1:
            work()
        else:
            threads = [threading.Thread(target=work, name=f"nbbpe-worker-{k}", daemon=True)
                       for k in range(self.num_workers)]
            for thread in threads:
                thread.start()
            try:
                for thread in threads:
                    thread.join()
            except BaseException:  # e.g. KeyboardInterrupt: stop the others before leaving
                stop.set()
                raise
        if failures:
            raise min(failures, key=lambda f: f[0])[1]
        return combine(finals)

    def map(self, fn: Callable, units: Iterable, *, ahead: int | None = None) -> Iterator:
        """`fn(unit)` of every unit, in the units' order; at most `ahead` (default: twice the
        workers) are started before the result of the oldest is taken."""
        ahead = max(1, ahead or 2 * self.num_workers)
        if self.num_workers == 1:
            yield from map(fn, units)
            return
        with ThreadPoolExecutor(self.num_workers, thread_name_prefix="nbbpe-worker") as pool:
            pending: deque = deque()
            try:
                for unit in units:
                    pending.append(pool.submit(fn, unit))
                    if len(pending) >= ahead:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:  # a failure or a consumer that stopped: drop the rest
                    future.cancel()


class _SharedIterator:
    """`next()` of an iterable from several threads: (index, item), or None at the end."""

    def __init__(self, items: Iterable):
        self._items = iter(items)
        self._lock = threading.Lock()
        self._index = 0

    def next(self):
        with self._lock:
            try:
                item = next(self._items)
            except StopIteration:
                return None
            self._index += 1
            return self._index - 1, item
