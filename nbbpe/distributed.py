"""Training and encoding on a Dask cluster: `DaskExecutor`, the interface of `workers.LocalExecutor`.

    from distributed import Client
    vocab, merges = nbbpe.train_bpe("/shared/corpus/", 32_000, ["<|endoftext|>"],
                                    client=Client("tcp://scheduler:8786"))
    nbbpe.encode_file(tokenizer, "/shared/corpus/", "/shared/tokens.bin", client=client)

This is the only module of nbbpe that imports dask and distributed; `train_bpe(client=...)` and
`encode_file(client=...)` import it when given a client. The scheduler and every worker need
nbbpe (and the packages the sources need: pyarrow for Parquet, ...) installed, like the client.

How the work is laid out, and why:

- `accumulate` (counting pre-tokens for training): consecutive units of work are grouped into
  tasks, a few per worker thread. A task makes a fresh state, adds its units in order and returns
  the state's `finish()` (a flat `PretokenCounts` table: NumPy arrays, cheap to ship). Tables are
  combined on the workers as they arrive, `fan_in` at a time, into one; only that one comes back
  to the client. Tasks are pure functions of small inputs (units name byte ranges of files), so
  a lost worker loses nothing: Dask recomputes what it held from the task graph.
- An iterator of `Batch`es (`train_bpe_from_iterator`) carries its data: batches are packed into
  tasks of about `group_bytes`, with a bounded number in flight, and the data travels inside the
  tasks, so that the scheduler can rerun them if a worker is lost. To keep that lineage (and the
  scheduler's memory) bounded, the running total is checkpointed every `lineage_bytes` of data:
  brought here and sent back as the seed of the rest, after which the batches before are freed.
- `map` (encoding into token files): the function (a `UnitEncoder` holding the tokenizer) is
  scattered to every worker once; consecutive units go together into tasks of about `map_bytes`
  (each task costs the scheduler and the client a few milliseconds, so not one per unit), at
  most `ahead` in flight, results taken in the units' order.
- Failures. A task that raises is retried by Dask (`retries`); a worker that dies has its tasks
  rerun elsewhere (Dask's `allowed-failures`). Errors that are the user's (invalid UTF-8, a bad
  JSONL line or Parquet file, a file a worker cannot read, a missing optional package) would fail
  again on every retry, so a task catches them and returns them as its result: they are never
  retried. As on local threads, the error raised is that of the earliest failing unit in source
  order: once a failure is seen, the tasks after it are cancelled, and those before it are
  awaited (any of them may hold an earlier error), so the message always names the first bad
  place.
- Paths are read by the workers themselves: they must be on a filesystem every machine shares
  at the same path, or fsspec URLs (s3://, gs://, ...). A worker that cannot open a file says so.
- Each worker process loads (or, on a cold Numba cache, compiles) the kernels once: a warm-up
  task per worker is queued first, ahead of the work, so that it happens at once on every worker,
  before any data transfer between workers is waiting on a busy one. Workers started with
  `dask worker ADDRESS --preload nbbpe.distributed` load them as they start (`dask_setup`), in a
  background thread that does not delay their start; `warm_up(client)` does it on demand.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

try:
    import distributed
except ImportError as _exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "running nbbpe on a Dask cluster needs the dask and distributed packages: "
        "pip install 'nbbpe[dask]'"
    ) from _exc

__all__ = ["DaskExecutor", "connect", "dask_setup", "load_kernels", "warm_up"]

# Errors that are the user's: the same input fails again on any retry, so they are not retried.
USER_ERRORS = (ValueError, TypeError, LookupError, ImportError, FileNotFoundError,
               PermissionError, IsADirectoryError, NotADirectoryError)
_UNREADABLE = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_SHARED_PATHS_HINT = ("every worker reads the source itself, so paths must be on a filesystem all "
                      "machines share (at the same path), or fsspec URLs (s3://, gs://, https://, ...)")

_WARM_UP_PRIORITY = 100  # before any work
_COMBINE_PRIORITY = 10  # tables are combined as soon as they are ready, ahead of more counting


def connect(address: str, *, timeout: float = 10.0) -> distributed.Client:
    """A `distributed.Client` connected to the scheduler at `address` (e.g. tcp://host:8786),
    or a ConnectionError that says how to start one."""
    try:
        return distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError) as exc:
        raise ConnectionError(
            f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({exc}); start "
            f"one with `dask scheduler` and workers with `dask worker {address}`"
        ) from None


def warm_up(client, *, timeout: float | None = None) -> dict[str, float]:
    """Load (or compile) nbbpe's kernels in every worker process now, e.g. right after starting a
    cluster, so that the first run does not wait for it; returns each worker's seconds.

    Runs start warming their workers up anyway; this only moves the cost. So does starting the
    workers with `dask worker ADDRESS --preload nbbpe.distributed` (see `dask_setup`)."""
    executor = client if isinstance(client, DaskExecutor) else DaskExecutor(client)
    futures = {address: executor.client.submit(
        _load_kernels_task, key=f"nbbpe-load-kernels-{uuid.uuid4().hex}", workers=[address],
        allow_other_workers=True, priority=_WARM_UP_PRIORITY, pure=False)
        for address in executor._nthreads()}
    distributed.wait(list(futures.values()), timeout=timeout)
    return {address: future.result() for address, future in futures.items()}


def load_kernels() -> float:
    """Load (or, on a cold Numba cache, compile) in this process the kernels that counting and
    encoding use with the built-in GPT-2 pattern; returns the seconds it took."""
    start = time.perf_counter()
    with _LOADING:
        if not _LOADED.is_set():
            from .patterns import GPT2_PATTERN
            from .pretokenize import _UnitCounterFactory
            from .pretokenize_kernels import merge_counts
            from .tokenizer import Tokenizer

            eot = "<|endoftext|>"
            _warm_up_counting(_UnitCounterFactory((GPT2_PATTERN, [eot], "strict", "auto"),
                                                  "strict", 1 << 20), merge_counts)
            vocab = {i: bytes([i]) for i in range(256)} | {256: b"th"}
            Tokenizer(vocab, [(b"t", b"h")], [eot]).encode(f"Warm up: the kernels load{eot}.")
            _LOADED.set()
    return time.perf_counter() - start


def dask_setup(worker) -> None:
    """Dask's preload hook (`dask worker ADDRESS --preload nbbpe.distributed`): the worker
    loads nbbpe's kernels in a background thread as it starts, without delaying its start (a
    cold Numba cache takes a minute or so to compile them)."""
    threading.Thread(target=_load_kernels_quietly, name="nbbpe-load-kernels", daemon=True).start()


_LOADING = threading.Lock()
_LOADED = threading.Event()


def _load_kernels_quietly() -> None:
    try:
        load_kernels()
    except Exception:  # the first task will load them, and report what goes wrong
        pass


def _load_kernels_task() -> float:
    return load_kernels()


class DaskExecutor:
    """Runs units of work on a Dask cluster, with the results of `workers.LocalExecutor`.

    `client` is a `distributed.Client` (or a scheduler address to connect to). Options:
    `retries`, how many times Dask reruns a task that raised (not for the user's errors);
    `tasks_per_thread`, how many counting tasks each worker thread gets for a planned source;
    `fan_in`, how many tables one combining task merges; `group_bytes`, the data of an iterator
    packed into one task; `lineage_bytes`, how much of an iterator's data may wait on the
    scheduler for reruns before the running total is checkpointed; `map_bytes`, the input of
    one encoding task (consecutive units); `ahead`, the encoding tasks in flight (default: two
    per worker thread, plus one); `wait_for_workers`, seconds to wait
    for a first worker; `no_workers_timeout`, seconds without any worker after which a run
    fails instead of waiting.
    """

    remote = True  # the work runs in other processes: nothing to warm up here

    def __init__(self, client, *, retries: int = 2, tasks_per_thread: int = 2, fan_in: int = 4,
                 group_bytes: int = 16 << 20, lineage_bytes: int = 512 << 20,
                 map_bytes: int = 16 << 20, ahead: int | None = None, wait_for_workers: float = 60.0,
                 no_workers_timeout: float = 300.0, poll_seconds: float = 2.0):
        if isinstance(client, str):
            client = connect(client)
        if not isinstance(client, distributed.Client):
            raise TypeError(f"client must be a distributed.Client, got {type(client).__name__}")
        if client.asynchronous:
            raise TypeError("an asynchronous distributed.Client is not supported; use a "
                            "synchronous one (the default)")
        for name, value in (("retries", retries), ("tasks_per_thread", tasks_per_thread),
                            ("fan_in", fan_in), ("group_bytes", group_bytes),
                            ("lineage_bytes", lineage_bytes), ("map_bytes", map_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (
                    0 if name == "retries" else 2 if name == "fan_in" else 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.client = client
        self.retries = retries
        self.tasks_per_thread = tasks_per_thread
        self.fan_in = fan_in
        self.group_bytes = group_bytes
        self.lineage_bytes = lineage_bytes
        self.map_bytes = map_bytes
        self.ahead = ahead
        self.wait_for_workers = wait_for_workers
        self.no_workers_timeout = no_workers_timeout
        self.poll_seconds = poll_seconds

    # --- the cluster ------------------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        """The worker threads of the cluster (waiting, for a while, for a first worker)."""
        return max(1, sum(self._nthreads().values()))

    def _nthreads(self) -> dict[str, int]:
        nthreads = self.client.nthreads()
        if not nthreads:
            try:
                self.client.wait_for_workers(1, timeout=self.wait_for_workers)
            except (TimeoutError, OSError):
                raise RuntimeError(
                    f"no Dask worker joined the scheduler {self._scheduler()} within "
                    f"{self.wait_for_workers:g} s; start some with "
                    f"`dask worker {self._scheduler()}`") from None
            nthreads = self.client.nthreads()
        return nthreads

    def _scheduler(self) -> str:
        return getattr(self.client.scheduler, "address", None) or "(unknown address)"

    def _warm_up(self, function: Callable, *args) -> list:
        """A task per worker, queued ahead of the work, that loads (or compiles) the kernels the
        work needs in that worker process. Not waited for: the work follows it on each worker."""
        return [self.client.submit(function, *args, key=f"nbbpe-warm-up-{uuid.uuid4().hex}",
                                   workers=[address], allow_other_workers=True,
                                   priority=_WARM_UP_PRIORITY, retries=0)
                for address in self._nthreads()]

    def _submit(self, function: Callable, *args, priority: int = 0, kind: str = "task"):
        with warnings.catch_warnings():  # batches and checkpoints travel inside their tasks
            warnings.filterwarnings("ignore", message=".*[Ll]arge graph.*")
            return self.client.submit(function, *args, key=f"nbbpe-{kind}-{uuid.uuid4().hex}",
                                      priority=priority, retries=self.retries)

    def _wait_first(self, futures) -> set:
        """The futures of `futures` that are done, waiting for at least one; fails instead of
        waiting forever if the cluster is left without workers."""
        no_workers_since = None
        while True:
            try:
                done, _ = distributed.wait(list(futures), timeout=self.poll_seconds,
                                           return_when="FIRST_COMPLETED")
                return done
            except TimeoutError:
                pass
            if self.client.status in ("closing", "closed"):
                raise RuntimeError("the Dask client was closed while nbbpe was running")
            if not self.client.nthreads():
                now = time.monotonic()
                no_workers_since = no_workers_since or now
                if now - no_workers_since > self.no_workers_timeout:
                    raise RuntimeError(
                        f"the Dask cluster {self._scheduler()} has had no workers for "
                        f"{self.no_workers_timeout:g} s; the work cannot go on")
            else:
                no_workers_since = None

    def _result(self, future):
        """`future.result()`, waiting with the same care as `_wait_first`."""
        self._wait_first([future])
        return future.result()

    # --- accumulate -------------------------------------------------------------------------

    def accumulate(self, make_state: Callable[[], Any], units: Iterable, combine: Callable,
                   progress: Callable[[int], object] | None = None):
        """`combine` of the `finish()` of states that were each given some of the units (see
        `LocalExecutor.accumulate`), counted on the cluster and combined there: only the final
        result comes back. `units` may be a lazy iterator (e.g. of batches): it is read once,
        with a bounded amount of data in flight."""
        run = _Accumulation(self, make_state, units, combine, progress)
        try:
            return run.run()
        finally:
            run.cancel_all()

    # --- map --------------------------------------------------------------------------------

    def map(self, fn: Callable, units: Iterable, *, ahead: int | None = None) -> Iterator:
        """`fn(unit)` of every unit, computed on the cluster, in the units' order. Consecutive
        units go together into tasks of about `map_bytes` (fewer for a small source, so that
        every thread gets several); at most `ahead` tasks are in flight (default: two per worker
        thread, plus one). `fn` is sent to every worker once (not with each task)."""
        nthreads = sum(self._nthreads().values())
        in_flight = max(1, ahead or self.ahead or 2 * nthreads + 1)
        if isinstance(units, Sequence):
            total = sum(map(_size, units))
            target = max(1, min(self.map_bytes, math.ceil(total / (16 * nthreads))))
        else:
            target = self.map_bytes
        client = self.client
        fn_future = client.scatter(fn, broadcast=True, hash=False)
        warm_ups = self._warm_up(_warm_up_map, fn_future)
        items = iter(units)
        pending: deque = deque()
        index = 0
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) < in_flight:
                    group, size = [], 0
                    for unit in items:
                        group.append(unit)
                        size += _size(unit)
                        if size >= target:
                            break
                    else:
                        exhausted = True
                    if group:
                        pending.append(self._submit(_apply_group, fn_future, index, group,
                                                    kind="units"))
                        index += len(group)
                if not pending:
                    break
                for result in self._take(pending.popleft()):
                    if isinstance(result, _Failed):
                        raise result.exception()
                    yield result
        finally:
            if pending:  # a failure, or a consumer that stopped: drop the rest
                client.cancel(list(pending))
            del warm_ups
            fn_future.release()

    def _take(self, future):
        try:
            return self._result(future)
        finally:
            future.release()


class _Accumulation:
    """One `DaskExecutor.accumulate` run: the leaves (counting tasks) in flight, the tables
    ready to combine, the combining tasks, and the earliest failure seen."""

    def __init__(self, executor: DaskExecutor, make_state, units, combine, progress):
        self.executor = executor
        self.client = executor.client
        self.make_state = make_state
        self.combine = combine
        self.progress = progress
        self.items = iter(units)
        nthreads = sum(executor._nthreads().values())
        self.max_leaves = max(2, executor.tasks_per_thread * nthreads)
        if isinstance(units, Sequence):  # planned units: a few tasks per thread
            total = sum(map(_size, units))
            self.target = max(1, math.ceil(total / self.max_leaves))
        else:  # a lazy iterator: tasks of about group_bytes
            self.target = executor.group_bytes
        self.leaves: dict = {}  # future -> (first index, number of units, bytes)
        self.combines: set = set()
        self.ready: list = []  # futures of tables not combined yet
        self.combined: set = set()  # keys of the ready futures that are combined results
        self.failure: tuple[int, BaseException] | None = None
        self.exhausted = False
        self.next_index = 0
        self.lineage = 0  # bytes of data in tasks since the last checkpoint
        self.warm_ups: list = []

    def run(self):
        self.warm_ups = self.executor._warm_up(_warm_up_counting, self.make_state, self.combine)
        while True:
            self._submit_leaves()
            if self.failure is not None:
                if not self.leaves:
                    break
            else:
                self._combine_ready()
                if not self.leaves and not self.combines and len(self.ready) <= 1:
                    if self.exhausted:
                        break
                    if self.lineage >= self.executor.lineage_bytes:
                        self._checkpoint()
                        continue
            waiting = set(self.leaves) | self.combines
            assert waiting, "nothing in flight"  # every branch above submits work or stops
            for future in self.executor._wait_first(waiting):
                if future in self.leaves:
                    self._leaf_done(future)
                elif future in self.combines:
                    self._combine_done(future)
        if self.failure is not None:
            raise self.failure[1]
        return self._final()

    def _draining(self) -> bool:
        return self.lineage >= self.executor.lineage_bytes

    def _submit_leaves(self) -> None:
        while (self.failure is None and not self.exhausted and not self._draining()
               and len(self.leaves) < self.max_leaves):
            first = self.next_index
            group, size, error = [], 0, None
            while size < self.target:
                try:
                    item = next(self.items)
                except StopIteration:
                    self.exhausted = True
                    break
                except BaseException as exc:  # the iterator itself failed (e.g. a non-str item)
                    self.exhausted = True
                    error = exc
                    break
                group.append(item)
                size += _size(item)
            if group:
                future = self.executor._submit(_count_group, self.make_state, first, group,
                                               kind="count")
                self.leaves[future] = (first, len(group), size)
                self.next_index += len(group)
                if any(not _is_planned(item) for item in group):
                    self.lineage += size
            if error is not None:  # after every item before it was submitted
                self._fail(self.next_index, error)

    def _leaf_done(self, future) -> None:
        first, count, size = self.leaves.pop(future)
        if future.status == "finished":
            if future.type is _Failed:
                failed = future.result()
                self._fail(failed.index, failed.exception())
            else:
                self.ready.append(future)
                if self.progress is not None:
                    self.progress(size)
        elif future.status == "error":
            exc = future.exception()
            self._fail(first, exc.with_traceback(future.traceback()))
        else:  # cancelled by Dask (e.g. the connection to the scheduler was lost)
            self._fail(first, RuntimeError(f"a counting task was {future.status} by Dask"))

    def _fail(self, index: int, exc: BaseException) -> None:
        """Record a failure at unit `index`; the earliest wins. Tasks after it are cancelled,
        the ones before it awaited (they are counted to the end, and may fail earlier)."""
        if self.failure is not None and self.failure[0] <= index:
            return
        self.failure = (index, exc)
        later = [f for f, (first, _, _) in self.leaves.items() if first > index]
        for future in later:
            del self.leaves[future]
        self._cancel(later + list(self.combines))  # nothing depends on these
        self._release(self.ready)
        self.combines.clear()
        self.ready = []

    def _combine_ready(self) -> None:
        fan_in = self.executor.fan_in
        final = (self.exhausted or self._draining()) and not self.leaves
        while len(self.ready) >= fan_in or (final and len(self.ready) >= 2):
            parts, self.ready = self.ready[:fan_in], self.ready[fan_in:]
            future = self.executor._submit(_combine_parts, self.combine, *parts,
                                           priority=_COMBINE_PRIORITY, kind="combine")
            self.combines.add(future)
            self._release(parts)  # the combining task holds them now

    def _combine_done(self, future) -> None:
        self.combines.discard(future)
        if future.status != "finished":  # a system error, after Dask's retries
            if future.status == "error":
                raise future.exception().with_traceback(future.traceback())
            raise RuntimeError(f"a combining task was {future.status} by Dask")
        self.ready.append(future)
        self.combined.add(future.key)

    def _checkpoint(self) -> None:
        """Bring the running total here and send it back as a task of its own: the tasks (and
        data) before it are then forgotten by the scheduler."""
        if self.ready:
            table = self.executor._result(self.ready[0])
            self._release(self.ready)
            self.ready = [self.executor._submit(_identity, table, priority=_COMBINE_PRIORITY,
                                                kind="checkpoint")]
            self.combined.add(self.ready[0].key)
            del table
        self.lineage = 0

    def _final(self):
        if not self.ready:  # no units at all
            return self.combine([self.make_state().finish()])
        future = self.ready[0]
        if future.key not in self.combined:  # a single leaf: combine it as the local path does
            future = self.executor._submit(_combine_parts, self.combine, future,
                                           priority=_COMBINE_PRIORITY, kind="combine")
        result = self.executor._result(future)
        if isinstance(result, _Failed):  # only if a failed leaf went unnoticed
            raise result.exception()
        return result

    def _cancel(self, futures) -> None:
        """Stop tasks that nothing else depends on (Dask cancels a task's dependents too)."""
        if futures:
            self.client.cancel(list(futures))
        self._release(futures)

    @staticmethod
    def _release(futures) -> None:
        """Let go of results: the tasks that depend on them keep them as long as needed."""
        for future in futures:
            future.release()

    def cancel_all(self) -> None:
        self._cancel([f for f in (*self.leaves, *self.combines) if not f.done()])
        self._release([*self.leaves, *self.combines, *self.ready])
        self.leaves.clear()
        self.combines.clear()
        self.ready = []
        self.warm_ups = []


# --- what runs on the workers -------------------------------------------------------------------


class _Failed:
    """A unit's error that is the user's, returned as a task's result (so Dask does not retry
    it) and raised by the client: `index` is the unit's place in the source order."""

    def __init__(self, index: int, exc: BaseException):
        self.index = index
        if isinstance(exc, _UNREADABLE) and not hasattr(exc, "nbbpe_path"):
            exc = _unreadable_on_worker(exc)
        elif isinstance(exc, ImportError):  # e.g. pyarrow missing on that worker
            exc = type(exc)(f"on Dask worker {_worker_name()}: {exc}", name=exc.name)
        try:
            pickle.dumps(exc)
        except Exception:  # an exception that cannot travel: its type and message do
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        self.error = exc

    def exception(self) -> BaseException:
        exc = self.error
        path = getattr(exc, "nbbpe_path", None)
        if (isinstance(exc, _UNREADABLE) and isinstance(path, str) and "://" not in path
                and os.access(path, os.R_OK)):
            exc = type(exc)(f"{exc} (this client can read it: the workers do not see the "
                            "client's filesystem)")
            exc.nbbpe_path = path
        return exc


def _unreadable_on_worker(exc: OSError) -> OSError:
    path = exc.filename
    reason = exc.strerror or str(exc)
    new = type(exc)(f"Dask worker {_worker_name()} cannot read {path!r}: {reason}; "
                    f"{_SHARED_PATHS_HINT}")
    new.nbbpe_path = path  # (not `filename`, which would replace the message in str())
    return new


def _worker_name() -> str:
    try:
        return distributed.get_worker().address
    except ValueError:  # not in a worker (tests, or a local call)
        import socket

        return socket.gethostname()


def _count_group(make_state, first: int, units: list):
    """A fresh state, the units added in order, its `finish()`; or the first user error."""
    state = make_state()
    index = first
    try:
        for index, unit in enumerate(units, first):
            state.add(unit)
        return state.finish()
    except USER_ERRORS as exc:
        return _Failed(index, exc)


def _combine_parts(combine, *parts):
    failed = [part for part in parts if isinstance(part, _Failed)]
    if failed:
        return min(failed, key=lambda f: f.index)
    return combine(list(parts))


def _identity(value):
    return value


def _apply_group(fn, first: int, units: list) -> list:
    """`fn` of each unit, in order; at the first user error, its `_Failed` ends the list."""
    results = []
    for index, unit in enumerate(units, first):
        try:
            results.append(fn(unit))
        except USER_ERRORS as exc:
            results.append(_Failed(index, exc))
            break
    return results


def _warm_batch():
    import numpy as np

    from .sources import Batch, Where

    data = np.frombuffer(b"Warm up: the kernels load once per worker.\n", dtype=np.uint8)
    return Batch(data, np.array([len(data)], dtype=np.int64), False, Where("warm-up", "byte", 0))


def _warm_up_counting(make_state, combine) -> bool:
    try:
        state = make_state()
        state.add(_warm_batch())
        table = state.finish()
        combine([table, table])
    except Exception:  # the work itself will report it
        return False
    return True


def _warm_up_map(fn) -> bool:
    tokenizer = getattr(fn, "tokenizer", None)
    try:
        if tokenizer is not None:
            tokenizer.encode("Warm up: the kernels load once per worker.")
    except Exception:
        return False
    return True


def _is_planned(item) -> bool:
    """Whether an item is a planned unit (small: it names a file range) rather than data."""
    return hasattr(item, "size_bytes")


def _size(item) -> int:
    data = getattr(item, "data", None)
    if data is not None:
        return len(data)
    size = getattr(item, "size_bytes", None)
    return 1 if size is None else max(1, size)
