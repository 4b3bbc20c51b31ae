"""Runtime: the engine's threads, limiter, nursery, single-flight calls, counters, failure log: what every part uses."""

from __future__ import annotations

import collections
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar, TypeVarTuple

import numpy as np
import trio

from ..errors import StoreError, ZarrfsError
from ..repeats import RepeatedFailures
from ..storage.base import BaseStore
from .config import EngineConfig
from .workers import Workers

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

log = logging.getLogger(__package__)  # failure lines name the engine, whichever part failed

# Concurrent store reads: enough to hide the latency of a remote store; local reads
# gain nothing past a handful. Decoding is CPU-bound: one thread per core (run_cpu).
IO_THREADS_REMOTE = 16
IO_THREADS_LOCAL = 4
DECODE_THREADS = max(1, os.cpu_count() or 1)
# After a store call timed out, a later call for the same key (the kernel reads the page again at
# once after a failed read-ahead; a program retries) does not start a wait of its own: it fails at
# once while the timed-out request, still running in its abandoned worker, is unanswered (at most
# `timeout` long), or for this long after the timeout when that request failed too (the kernel's
# retry comes within milliseconds). A store that is back answers that request, and the mount
# serves again at once, no remount.
STALL_GRACE_S = 1.0
COUNTERS = (
    "reads",
    "chunk_gets",
    "chunk_bytes",
    "fill_chunks",
    "bytes_decoded",
    "prefetched",
    "bytes_written",
    "chunks_stored",
    "chunks_erased",
    "oversize_loads",
    "plain_files_stored",
    "plain_bytes_stored",
    "direct_reads",
    "direct_bytes",
    "revalidations",
    "chunks_changed",
    "pinned_reads",
    "band_reads",
    "bands_assembled",
    "small_reads",
    "row_reads",
    "buffers_reused",
    "chunks_dropped",
    "streamed_reads",
    "previews",
    "preview_chunks",
    "preview_decoded_bytes",
)


def _call_name(fn: object) -> str:
    """What a store call was, for its timeout message (`list_dir_sync` -> `list dir`)."""
    return getattr(fn, "__name__", "store call").removesuffix("_sync").replace("_", " ")


class Flight:
    """One call in flight (a chunk load, a listing), shared by every caller that wants its result."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None  # what the call returned: a chunk, a shard index, a listing
        self.error: BaseException | None = None


class Runtime:
    """Where the engine's parts run their work: store calls bounded by the timeout, decoding
    threads, the background nursery; and what they count. Used from the trio thread."""

    def __init__(self, store: BaseStore, config: EngineConfig) -> None:
        self.store = store
        self.timeout_s = config.timeout_s
        self.io_limiter = trio.CapacityLimiter(IO_THREADS_LOCAL if store.is_local else IO_THREADS_REMOTE)
        self._decoders = Workers(DECODE_THREADS, config.decoder_thread_name)  # run_cpu
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self.errors: collections.Counter[str] = collections.Counter()
        self.failures = RepeatedFailures()  # which failure lines reach the log; failures by key
        self.decode_seconds = 0.0
        self._nursery: trio.Nursery | None = None
        self._flights: dict[Hashable, Flight] = {}  # once(): calls in flight by key
        # Keys whose store call timed out: (when, its worker's outcome: None while it runs, then
        # "ok" or "failed").
        self._stalled: dict[Hashable, tuple[float, list[str | None]]] = {}

    @property
    def decode_threads(self) -> int:
        """How many decoding threads run_cpu has."""
        return self._decoders.threads

    @property
    def running(self) -> bool:
        """Whether background work runs (the engine's `run` hosts it)."""
        return self._nursery is not None

    def attach(self, nursery: trio.Nursery) -> None:
        """The nursery background work runs in (the engine's, while it runs)."""
        self._nursery = nursery

    def start_soon(self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        """Start `fn(*args)` as a background task (only while `running`)."""
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    async def run_io(
        self,
        fn: Callable[[*Ts], T],
        *args: *Ts,
        key: Hashable | None = None,
        cpu: bool = False,
        ended: Callable[[], None] | None = None,
    ) -> T:
        """Run a blocking store call in a worker thread under the I/O limiter, for at most
        `timeout_s` (waiting for a thread included); then StoreError (EIO). The caller stops
        waiting at once when cancelled or timed out: a thread stuck in the store is left behind
        (its backend's own timeouts end it) instead of holding the reader. With `key` (what the
        call reads: a chunk, a listing), a call whose key just timed out does not wait again.
        With `cpu`, the call also decodes: it runs in a decoding thread (run_cpu) instead, and
        ENDED, if given, is called in the engine's thread once that thread is done with the call
        (it ran to its end, or will never run), even when the caller stopped waiting for it."""
        assert ended is None or cpu
        if key is not None and key in self._stalled:
            try:
                self._after_stall(key, fn)
            except StoreError:
                if ended is not None:
                    ended()
                raise
        outcome: list[str | None] = [None]  # written by the worker alone (one reference, no table)

        def call() -> T:
            try:
                value = fn(*args)
                outcome[0] = "ok"
                return value
            finally:
                outcome[0] = outcome[0] or "failed"

        with trio.move_on_after(self.timeout_s) as scope:
            if cpu:
                return await self.run_cpu(call, abandon=True, ended=ended)
            return await trio.to_thread.run_sync(call, limiter=self.io_limiter, abandon_on_cancel=True)
        assert scope.cancelled_caught
        self.errors["timeout"] += 1
        if key is not None:
            now = time.monotonic()
            for old in [k for k, (t, _) in self._stalled.items() if now - t > self.timeout_s]:
                del self._stalled[old]  # forgotten: asked again like any key
            self._stalled[key] = (now, outcome)
        raise StoreError(f"the store did not answer within {self.timeout_s:g} s (timeout; {_call_name(fn)})")

    def _after_stall(self, key: Hashable, fn: object) -> None:
        """Before asking the store for a key whose last call timed out: StoreError at once while
        that call is unanswered or has just failed too; else (answered, or old) forget it."""
        since, outcome = self._stalled[key]
        age = time.monotonic() - since
        if outcome[0] == "ok" or (outcome[0] == "failed" and age > STALL_GRACE_S) or age > self.timeout_s:
            del self._stalled[key]
            return
        self.errors["timeout"] += 1
        state = "is still unanswered" if outcome[0] is None else "failed too"
        raise StoreError(
            f"the store did not answer within {self.timeout_s:g} s (timeout; {_call_name(fn)}; "
            f"not asked again: its request of {age:.1f} s ago {state})"
        )

    async def run_cpu(
        self, fn: Callable[[*Ts], T], *args: *Ts, abandon: bool = False, ended: Callable[[], None] | None = None
    ) -> T:
        """`fn(*args)` in a decoding thread (workers.py), calls taken in the order asked.

        Cancelled, a call not started is dropped; a running one is waited for, as
        trio.to_thread does (the cancellation reaches the caller at its next checkpoint), or
        with ABANDON left to finish on its own, its result dropped, and its thread replaced.
        ENDED is called in this thread once the call ended or was dropped, waited for or not.
        """
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def soon(then: Callable[[], None]) -> Callable[[object], None]:
            def callback(_: object) -> None:
                try:
                    token.run_sync_soon(then)
                except trio.RunFinishedError:  # abandoned when the engine stopped
                    pass

            return callback

        future = self._decoders.submit(fn, *args)
        if ended is not None:  # (first: it has run when the caller goes on)
            future.add_done_callback(soon(ended))
        future.add_done_callback(soon(done.set))
        try:
            await done.wait()
        except trio.Cancelled:
            if future.cancel():
                raise
            if abandon:
                self._decoders.abandon(future)
                raise
            with trio.CancelScope(shield=True):
                await done.wait()
        return future.result()

    async def run_io_long(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """A store operation of many keys (commit, erase or move a node) that runs to its end:
        bounding it would leave the node half changed while the caller believes it failed."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.io_limiter)

    async def run_io_shielded(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """run_io_long that finishes even when the caller is cancelled (clean-up after a failure)."""
        with trio.CancelScope(shield=True):
            value = await self.run_io_long(fn, *args)
        return value

    def start_soon_thread(self, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        """Run `fn(*args)` in a worker thread in the background, not awaited (nothing without run())."""
        if self._nursery is not None:
            self._nursery.start_soon(functools.partial(trio.to_thread.run_sync, fn, *args, abandon_on_cancel=True))

    async def once(self, key: Hashable, fn: Callable[[], Awaitable[T]]) -> T:
        """`await fn()`, shared: a call with the same key while one is in flight waits for it
        and gets its result or error (a directory listing is loaded once for every reader)."""
        while True:
            flight = self._flights.get(key)
            if flight is None:
                break
            await flight.done.wait()
            if isinstance(flight.error, Exception):
                raise flight.error
            if flight.error is None:
                return flight.value  # (a flight of KEY is a call of the same result type)
            # the first caller was cancelled: try again
        flight = self._flights[key] = Flight()
        try:
            value = flight.value = await fn()
            return value
        except BaseException as e:
            flight.error = e
            raise
        finally:
            if self._flights.get(key) is flight:  # (else dropped: forget_flights)
                del self._flights[key]
            flight.done.set()

    async def gather(self, *calls: Callable[[], Awaitable[Any]]) -> list[Any]:
        """`await call()` of each call at once; their results in order, or the first failure
        (once every call has ended)."""
        results: list[Any] = [None] * len(calls)
        errors: list[Exception] = []

        async def one(i: int, call: Callable[[], Awaitable[Any]]) -> None:
            try:
                results[i] = await call()
            except Exception as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
        if errors:
            raise errors[0]
        return results

    def in_flight(self, key: Hashable) -> bool:
        """Whether a `once` call of KEY is in flight."""
        return key in self._flights

    def forget_flights(self, which: Callable[[Hashable], bool]) -> None:
        """Later `once` calls of the keys WHICH selects start their own (the running ones go on)."""
        for key in [k for k in self._flights if which(k)]:
            del self._flights[key]

    def count_error(self, error: ZarrfsError, key: str) -> None:
        """Count a failure of KEY and log it, unless the same was logged within the minute or the
        store logged it already (one line for many keys failing for one cause)."""
        self.errors[type(error).__name__] += 1
        text = str(error)
        line = self.failures.line(key, text if key in text else f"{key}: {text}")
        if line is not None and not error.logged_by_store:
            log.warning("%s", line)
        error.logged = True  # the FUSE layer does not log it again for each request it fails

    def decoded(self, arrs: list[np.ndarray], seconds: float) -> None:
        """Count decoded chunks and the time their decoding took."""
        self.decode_seconds += seconds
        self.counters["bytes_decoded"] += sum(a.nbytes for a in arrs)
