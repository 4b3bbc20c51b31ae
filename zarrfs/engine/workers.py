"""Decoding threads: one per core, each taking the next call from one queue as soon as it is free.

Decoding is CPU-bound, so it runs in as many threads as there are cores. Under a trio limiter
around trio.to_thread calls, a thread could start its next decode only after the end of the
last reached the trio thread, which passed the turn on: a thread busy replying to the kernel
kept them waiting. Here a thread takes the next call itself, and only its result goes
through the trio thread (Runtime.run_cpu; docs/PERFORMANCE.md).

(concurrent.futures.ThreadPoolExecutor has the queue, but joins its threads at exit, a
thread stuck in a store included, keeps idle ones for good, and cannot replace one.)
The threads are daemon threads, started when first needed and leaving after IDLE_S without a
call (with what they keep: a decoding thread's scratch buffer, loads.py): a call stuck in a
store never keeps the process from exiting. A call its caller gave up on while it runs
(`abandon`) is replaced by a new thread, so that calls stuck in a store hold no decoding thread.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

IDLE_S = 10.0  # as trio's own worker threads


class Workers:
    """THREADS daemon threads taking calls from one queue, in the order they were submitted."""

    def __init__(self, threads: int, name: str) -> None:
        self.threads, self.name = threads, name
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._counted = 0  # threads started, not stuck in an abandoned call
        self._stuck: set[concurrent.futures.Future[Any]] = set()  # abandoned calls still running

    def submit(self, fn: Callable[[*Ts], T], *args: *Ts) -> concurrent.futures.Future[T]:
        """Queue `fn(*args)`; its Future is settled in a worker thread (cancel() drops it if not started)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:  # (a thread leaving when idle sees it: `_work`)
            self._queue.put((future, fn, args))
        self._start()
        return future

    def abandon(self, future: concurrent.futures.Future[Any]) -> None:
        """FUTURE's caller gave up on it while it runs: its thread leaves when it ends, and
        another takes its place now."""
        with self._lock:
            if future.done():
                return
            self._stuck.add(future)
            self._counted -= 1
        self._start()

    def _start(self) -> None:
        with self._lock:
            if self._counted >= self.threads:
                return
            self._counted += 1
        threading.Thread(target=self._work, name=self.name, daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                future, fn, args = self._queue.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():  # (else a call came in meanwhile: take it)
                        self._counted -= 1
                        return
                continue
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # the caller's to see
                    future.set_exception(e)
            with self._lock:
                if future in self._stuck:  # replaced already
                    self._stuck.discard(future)
                    return
            del future, fn, args  # (an idle thread keeps no result or buffer alive)
