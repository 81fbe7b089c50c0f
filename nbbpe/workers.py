"""Worker processes that run one handler over tasks sent by the parent (e.g. byte ranges of a file).

The parent submits tasks one at a time, so it decides how far ahead of the slowest task the
workers may run (that bounds the results waiting in memory). Failures never hang and never go
unreported: an exception in a worker is raised in the parent with the worker's traceback, a worker
that dies (killed, out of memory) is reported with its exit code, and workers exit by themselves
when the parent dies, so a killed run leaves no process behind.

Workers are forked where the OS allows it, so they start at once and share what the parent has
already loaded (compiled kernels, a tokenizer); elsewhere they are spawned, and the handler
factory and its arguments must then be picklable.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import sys
import traceback
from collections.abc import Callable

_POLL_SECONDS = 0.5  # how often a waiting parent checks for dead workers, and workers for a dead parent


def default_num_workers() -> int:
    """The CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def process_context():
    """fork starts workers at once and shares the imported modules; elsewhere, spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _serve(make_handler, args, parent_pid, tasks, results) -> None:
    """Worker: build the handler, then answer tasks until a None (or until the parent is gone)."""
    try:
        handle = make_handler(*args)
        while True:
            try:
                item = tasks.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if os.getppid() != parent_pid:  # orphaned: nobody will read the results
                    os._exit(1)
                continue
            if item is None:
                finish = getattr(handle, "finish", None)
                if finish is not None:  # a handler that accumulates sends its total once
                    results.put(("final", None, finish()))
                return
            key, task = item
            results.put(("done", key, handle(task)))
    except BaseException as exc:  # report every failure; the parent raises it
        try:
            pickle.dumps(exc)
        except Exception:  # the queue pickles in a thread, where a failure would be lost
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        results.put(("error", exc, traceback.format_exc()))
        results.close()
        results.join_thread()  # the message is in the pipe before the exit code is set
        sys.exit(1)


class WorkerPool:
    """`num_workers` processes, each running `make_handler(*args)(task)` on submitted tasks.

    `submit(key, task)` queues a task; `next_result()` returns `(key, result)` of some finished
    task (in no particular order), raising a worker's exception or a `RuntimeError` naming a dead
    worker. A handler that accumulates (e.g. counts over all its tasks) may have a `finish()`
    method: `finish()` on the pool collects what each worker's returns. Use as a context
    manager: leaving it stops the workers.
    """

    def __init__(self, make_handler: Callable, args: tuple, num_workers: int, *, what: str):
        self.what = what
        context = process_context()
        self._tasks = context.Queue()
        self._results = context.Queue()
        self._workers = [
            context.Process(target=_serve, daemon=True,
                            args=(make_handler, args, os.getpid(), self._tasks, self._results))
            for _ in range(num_workers)
        ]
        self.pending = 0
        for worker in self._workers:
            worker.start()

    def submit(self, key, task) -> None:
        self._tasks.put((key, task))
        self.pending += 1

    def next_result(self):
        if not self.pending:
            raise RuntimeError("next_result: no task is pending")
        message = self._next_message("done")
        self.pending -= 1
        return message[1], message[2]

    def finish(self) -> list:
        """Ask every worker to stop and return what its handler's `finish()` gives, one per
        worker, once all submitted tasks' results have been taken with `next_result`."""
        if self.pending:
            raise RuntimeError("finish: results of submitted tasks are still pending")
        for _ in self._workers:
            self._tasks.put(None)
        return [self._next_message("final")[2] for _ in self._workers]

    def _next_message(self, kind: str):
        """The next message of `kind` from a worker; raises its error, or names a dead worker."""
        while True:
            try:
                message = self._results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                # Workers exit by themselves only after sending their final message.
                dead = [w for w in self._workers if w.exitcode is not None
                        and (w.exitcode != 0 or kind != "final")]
                if not dead:
                    continue
                try:  # a worker that failed put its error first: take it if it is there
                    message = self._results.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    raise RuntimeError(
                        f"a worker process died (exit code {dead[0].exitcode}) while {self.what}; "
                        "no result was produced"
                    ) from None
            if message[0] == "error":
                raise message[1] from RuntimeError(f"in a worker process:\n{message[2]}")
            if message[0] == kind:
                return message

    def close(self) -> None:
        """Stop the workers: ask them to finish, and end any that are still busy."""
        for _ in self._workers:
            self._tasks.put(None)
        for worker in self._workers:
            if self.pending:  # abandoned work (an error, an interrupt): do not wait for it
                worker.terminate()
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
                worker.join()
        self._tasks.close()
        self._results.close()
        self._tasks.cancel_join_thread()  # the sentinels may never be read

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
