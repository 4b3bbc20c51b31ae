"""Staging areas of writers that died: each writing daemon's lease, and the sweep that removes what
a killed writer left staged when a writable mount starts.

A daemon about to stage an array writes a lease key at the store's root, `.zarrfs-lease-WRITER`,
naming its host, process and times, and names its staging areas `.zarrfs-new-WRITER-TOKEN`. It
refreshes the lease while it stages and erases it once it stages nothing. A staging area is
stale when its writer is known to be gone: a process of this machine that no longer runs, or a
lease (of another machine) not refreshed for LEASE_STALE_S; an area with no lease counts as
stale once none of its keys changed for that long.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..errors import ZarrfsError
from ..repeats import LogOnce
from .base import BaseStore
from .keys import DIRECT_MARKER, RESERVED_PREFIX, STAGING_PREFIX, ChunkKeys, is_staging_key, join

log = logging.getLogger(__name__)

LEASE_PREFIX = RESERVED_PREFIX + "-lease-"
# A writer rewrites its lease this often while it stages: one small store write per period.
LEASE_REFRESH_S = 300.0
# A lease of another machine not refreshed for this long names a writer that is gone: twelve
# missed refreshes, and room for clocks of different machines that disagree by many minutes.
LEASE_STALE_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Machine:
    """Where a process runs: process ids compare only within one host, boot and pid namespace."""

    host: str
    boot_id: str
    pid_namespace: str


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def this_machine() -> Machine:
    """This process's host name, boot and pid namespace (empty strings where /proc has none)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return Machine(socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), namespace)


def process_start_ticks(pid: int) -> int | None:
    """When process PID started (clock ticks since boot), or None when no such process runs."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rsplit(")", 1)[-1].split() if stat else []
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of proc(5); the fields after the command name start at 3


def _when(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch_s))


def _size(nbytes: float) -> str:
    """NBYTES for a log line: bytes below 1 KiB, else KiB, MiB or GiB with one decimal."""
    if nbytes < 1024:
        return f"{int(nbytes)} bytes"
    for unit in ("KiB", "MiB"):
        nbytes /= 1024
        if nbytes < 1024:
            return f"{nbytes:.1f} {unit}"
    return f"{nbytes / 1024:.1f} GiB"


@dataclasses.dataclass(frozen=True)
class Lease:
    """What a writer's lease key holds."""

    writer: str
    machine: Machine
    pid: int
    pid_start: int | None
    mounted_s: float
    refreshed_s: float

    def to_bytes(self) -> bytes:
        doc = {
            "writer": self.writer,
            "host": self.machine.host,
            "boot_id": self.machine.boot_id,
            "pid_namespace": self.machine.pid_namespace,
            "pid": self.pid,
            "pid_start_ticks": self.pid_start,
            "mounted": self.mounted_s,
            "refreshed": self.refreshed_s,
        }
        return (json.dumps(doc, indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> Lease | None:
        """The lease a key holds; None when it is absent or not a lease this code wrote."""
        try:
            doc = json.loads(raw) if raw is not None else None
            if not isinstance(doc, dict):
                return None
            start = doc.get("pid_start_ticks")
            if not all(math.isfinite(float(doc[k])) for k in ("mounted", "refreshed")):
                return None
            return cls(
                str(doc["writer"]),
                Machine(str(doc["host"]), str(doc["boot_id"]), str(doc["pid_namespace"])),
                int(doc["pid"]),
                None if start is None else int(start),
                float(doc["mounted"]),
                float(doc["refreshed"]),
            )
        except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
            return None

    def gone_because(self, here: Machine, now_s: float) -> str | None:
        """Why this lease's writer is known to be gone, or None while it may be at work."""
        if self.machine == here and here.boot_id:
            running = process_start_ticks(self.pid)
            if running is None:
                return "no longer running"
            if self.pid_start is not None and running != self.pid_start:
                return "no longer running (its pid now names another process)"
            return None
        if now_s - self.refreshed_s > LEASE_STALE_S:
            return f"its lease not refreshed since {_when(self.refreshed_s)}"
        return None

    def describe(self) -> str:
        return f"host {self.machine.host} pid {self.pid}, mounted at {_when(self.mounted_s)}"


def staging_writer(name: str) -> str | None:
    """The writer id in a staging area's name; None for a name without one (older daemons)."""
    writer, sep, _ = name[len(STAGING_PREFIX) :].partition("-")
    return writer if sep and writer else None


class LeaseKeeper:
    """This daemon's lease: written with its first staged key (a sweep keeps an area with no
    lease while its keys are recent, so the two may go up at once), refreshed while it stages,
    erased as soon as it stages nothing. `write_sync` and `erase_sync` do store I/O (worker
    threads); the others run in the main loop, which takes one step at a time (`due`)."""

    def __init__(self, store: BaseStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self.writer = secrets.token_hex(6)
        self.key = LEASE_PREFIX + self.writer
        self.areas: set[str] = set()  # staging prefixes in use
        self.written = False
        self._mounted_s = clock()
        self._machine = this_machine()
        self._start = process_start_ticks(os.getpid())
        self._failure_said = LogOnce()

    def claim(self, staging: str) -> None:
        """A staging area comes into use (the lease must be written with its first key)."""
        self.areas.add(staging)

    def release(self, staging: str) -> None:
        self.areas.discard(staging)

    def due(self, refresh: bool = False) -> Callable[[], None] | None:
        """The store step that brings the lease up to date: written while staging (again when
        REFRESH), erased once not; None when there is nothing to do."""
        if self.areas:
            return self.write_sync if refresh or not self.written else None
        return self.erase_sync if self.written else None

    def write_sync(self) -> None:
        lease = Lease(self.writer, self._machine, os.getpid(), self._start, self._mounted_s, self.clock())
        self.store.set_sync(self.key, lease.to_bytes())
        self.written = True

    def erase_sync(self) -> None:
        self.store.erase_sync(self.key)
        self.written = False

    def failed(self, error: ZarrfsError) -> None:
        """A lease write or erase failed: said once; the staging goes on without it (an area
        with no lease is kept while its keys are recent)."""
        if self._failure_said.first(self.key):
            log.warning("%s: this writer's lease could not be written or erased: %s", self.key, error)


class StagingPlaces(Protocol):
    """What a sweep asks of a hierarchy (formats/base.py): its store and where staging areas may be."""

    store: BaseStore

    def staging_dirs(self) -> Iterator[str]: ...


def sweep_sync(
    hierarchy: StagingPlaces, own_writer: str, now_s: float | None = None, dirs: Iterator[str] | None = None
) -> dict[str, Any]:
    """Remove the staging areas (and leases) of writers that died, each with one log line.

    Never raises: a store that fails stops the sweep with one log line. Returns counts
    (`removed`, `kept`, `leases_removed`) and `stopped` (the reason, or None).
    """
    store = hierarchy.store
    now_s = time.time() if now_s is None else now_s
    here = this_machine()
    out: dict[str, Any] = {"removed": 0, "kept": 0, "leases_removed": 0, "stopped": None}
    try:
        files, _ = store.list_dir_sync("")
        leases = {
            name[len(LEASE_PREFIX) :]: Lease.from_bytes(store.get_sync(name))
            for name in files
            if name.startswith(LEASE_PREFIX) and name != LEASE_PREFIX + own_writer
        }
        for parent in hierarchy.staging_dirs() if dirs is None else dirs:
            for name in store.list_dir_sync(parent)[1]:
                if not name.startswith(STAGING_PREFIX):
                    continue
                writer = staging_writer(name)
                if writer == own_writer:
                    continue
                if _sweep_area_sync(store, join(parent, name), leases.get(writer) if writer else None, here, now_s):
                    out["removed"] += 1
                else:
                    out["kept"] += 1
        for writer, lease in leases.items():
            if lease is None or lease.gone_because(here, now_s) is not None:
                store.erase_sync(LEASE_PREFIX + writer)
                out["leases_removed"] += 1
                log.info(
                    "removed the lease %s%s of a writer that is gone%s",
                    LEASE_PREFIX,
                    writer,
                    f" ({lease.describe()})" if lease is not None else " (unreadable)",
                )
    except Exception as e:  # a store that fails (or a hierarchy that cannot be walked) ends the sweep
        out["stopped"] = str(e) if isinstance(e, ZarrfsError) else f"{type(e).__name__}: {e}"
        log.warning("looking for staging areas of writers that died stopped: %s", out["stopped"])
    log.info(
        "staging check done: %d staging areas of writers that died removed, %d kept, %d stale leases removed",
        out["removed"],
        out["kept"],
        out["leases_removed"],
    )
    return out


def _sweep_area_sync(store: BaseStore, prefix: str, lease: Lease | None, here: Machine, now_s: float) -> bool:
    """Remove one staging area if its writer is gone; whether it was removed."""
    keys = store.versions_below_sync(prefix)
    nbytes = sum(size or 0 for size, _, _ in keys.values())
    if lease is not None:
        why = lease.gone_because(here, now_s)
        if why is None:
            return False
        whose = f"from {lease.describe()}: {why}"
    else:
        times = [mtime for _, mtime, _ in keys.values() if mtime is not None]
        newest_s = max(times) / 1e9 if times else None
        if keys and (newest_s is None or now_s - newest_s <= LEASE_STALE_S):
            return False  # maybe a writer at work without a lease: kept while its keys are recent
        whose = (
            f"with no lease, no key written since {_when(newest_s)}"
            if newest_s is not None
            else "with no lease and no keys"
        )
    if DIRECT_MARKER in keys:
        _sweep_direct_sync(store, prefix)
    store.erase_below_sync(prefix)
    log.warning(
        "removed the staging area %s of a writer that died: %d keys, %s, %s", prefix, len(keys), _size(nbytes), whose
    )
    return True


def _sweep_direct_sync(store: BaseStore, area: str) -> None:
    """A writer that died while writing an array's chunks under their final keys: if its metadata
    document is in the store, the keys under the prefix that are neither its documents nor its
    chunks (the old array's) go; else its chunks go (keys of its encoding: never the old array's).
    Nothing goes while another writer's marker names the same prefix: that writer may be storing
    keys of the same names, and its commit erases those of its encoding it did not store."""
    marker_key = join(area, DIRECT_MARKER)
    try:
        marker = json.loads(store.get_sync(marker_key) or b"null")
        keys = ChunkKeys(str(marker["prefix"]), str(marker["separator"]), str(marker["head"]), str(marker["zero_d"]))
        documents = {str(d) for d in marker["documents"]}
        metadata_key, digest = str(marker["metadata_key"]), str(marker["metadata_sha256"])
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, ZarrfsError) as e:
        log.warning("%s: not a marker this code wrote (%s); the keys it names stay", marker_key, e)
        return
    if not keys.prefix:
        return
    metadata = store.get_sync(metadata_key)
    committed = metadata is not None and hashlib.sha256(metadata).hexdigest() == digest
    below = [join(keys.prefix, rel) for rel in store.sizes_below_sync(keys.prefix)]
    if _written_again_sync(store, area, keys.prefix):  # after the listing: its first keys follow its marker
        log.info("%s: another writer is writing %s now; the keys under it stay", marker_key, keys.prefix)
        return
    if committed:
        gone = [k for k in below if k not in documents and not keys.is_key(k) and not is_staging_key(k)]
    else:
        gone = [k for k in below if keys.is_key(k)]
    store.erase_many_sync(gone)
    if gone:
        what = "of the array it replaced" if committed else "it wrote without their metadata"
        log.warning("removed %d keys under %s %s (a writer that died)", len(gone), keys.prefix, what)


def _written_again_sync(store: BaseStore, area: str, prefix: str) -> bool:
    """Whether a staging area beside AREA other than it holds a direct marker naming PREFIX."""
    parent, _, own = area.rpartition("/")
    for name in store.list_dir_sync(parent)[1]:
        if not name.startswith(STAGING_PREFIX) or name == own:
            continue
        try:
            marker = json.loads(store.get_sync(join(parent, name, DIRECT_MARKER)) or b"null")
        except (ValueError, UnicodeDecodeError):
            continue  # not a marker this code wrote
        if isinstance(marker, dict) and marker.get("prefix") == prefix:
            return True
    return False
