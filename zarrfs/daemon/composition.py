"""The composition root: the one place that builds a mount from its Options, store -> hierarchy -> engine -> tree -> FUSE operations."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from .. import formats
from ..codecs.adapters import compressor_config
from ..engine import Engine, EngineConfig
from ..engine.cache import ChunkCache
from ..errors import UserError
from ..formats.base import Hierarchy
from ..formats.icechunk import IcechunkHierarchy
from ..fuse_ops import ZarrOperations, invalidate_data_sync, invalidate_name
from ..model import BrokenNode
from ..options import Options, read_storage_options_file, redact_url, secrets_in
from ..storage import icechunk
from ..storage.base import BaseStore
from ..storage.diskcache import DiskCache, DiskCachedStore, default_cache_dir, store_identity
from ..storage.keys import RESERVED_PREFIX
from ..storage.references import open_references_sync
from ..storage.remote import (
    REMOTE_METADATA_TTL_S,
    bound_retries,
    bounded_storage_options,
    default_metadata_ttl_s,
    is_remote,
    missing_backend,
)
from ..storage.store import Store
from ..tree.namespace import Namespace
from . import allocator
from .logs import register_secrets

log = logging.getLogger("zarrfs")

# Longest wait for the store to answer at start-up (connection, credentials, the root's listing):
# long enough for a slow remote store, short enough that a boot with the network down does not
# hang a mount(8) for minutes.
START_TIMEOUT_S = float(os.environ.get("ZARRFS_START_TIMEOUT_S", "30"))
# systemd's credential for storage options (LoadCredential=storage_options.json:PATH).
CREDENTIAL_NAME = "storage_options.json"


def storage_options_of(options: Options) -> dict[str, Any]:
    """storage_options_file (or systemd's credential) merged under storage_options."""
    path = options.storage_options_file
    credentials_dir = os.environ.get("CREDENTIALS_DIRECTORY")
    if path is None and credentials_dir and os.path.exists(os.path.join(credentials_dir, CREDENTIAL_NAME)):
        path = os.path.join(credentials_dir, CREDENTIAL_NAME)
    merged = read_storage_options_file(path) if path else {}
    merged.update(options.storage_options)
    return merged


def build(source: str, options: Options) -> ZarrOperations:
    """Open the store and its hierarchy; everything that can be a user error happens here."""
    allocator.one_heap()  # before any thread of the daemon's starts
    storage_options = storage_options_of(options)
    register_secrets(secrets_in(storage_options, source) | secrets_in(options.remote_options))
    shown = redact_url(source)
    opened = open_store(source, storage_options, options, shown)
    check_store(opened, shown, min(START_TIMEOUT_S, options.timeout_s))
    versioned = options.format == "icechunk" or (
        options.format == "auto" and icechunk.looks_like_repository_sync(opened)
    )
    store: BaseStore = opened
    if versioned:
        store = icechunk.IcechunkStore(
            source,
            storage_options,
            ref=options.ref,
            snapshot=options.snapshot,
            log_level=options.log_level,
            timeout_s=options.timeout_s,
            writable=options.writable,
            authorized=options.authorize_virtual_chunk_access,
        )
    elif options.ref is not None or options.snapshot is not None:
        raise UserError(f"{shown}: ref= and snapshot= choose a version of an Icechunk repository; this is not one")
    if options.writable and store.read_only:
        scheme = source.split("://", 1)[0] if "://" in source else "this protocol"
        what = "references" if store.is_references else f"{scheme} stores"
        raise UserError(f"{shown}: {what} cannot be written; mount it without writable")
    metadata_ttl_s = mount_metadata_ttl_s(source, options, store)
    # metadata_ttl=0 asks the store at every read: a kept entry would cost a listing each time.
    # An Icechunk repository's keys are its snapshots' own, not objects of the store: not cached.
    if (
        is_remote(source)
        and not versioned
        and not store.is_local
        and not store.is_references
        and options.disk_cache_bytes > 0
        and metadata_ttl_s > 0
    ):
        disk = DiskCache(options.cache_dir or default_cache_dir(), options.disk_cache_bytes)
        if disk.usable:
            log.info("disk cache: %s, at most %d bytes", disk.directory, disk.max_bytes)
            store = DiskCachedStore(
                opened,
                disk,
                store_identity(source, storage_options),
                metadata_ttl_s,
                own_prefix=RESERVED_PREFIX,
            )
    if options.codec:
        compressor_config(options.codec, "none", 1)  # an unknown codec name is a user error now, not later
    hierarchy: Hierarchy
    if versioned:  # an Icechunk snapshot holds a Zarr v3 hierarchy, read as it is
        hierarchy = IcechunkHierarchy.open_sync(store, options)
    else:
        hierarchy = formats.open_hierarchy_sync(store, options.format, options)
    root = hierarchy.node_sync("")
    if root is None:
        raise UserError(f"{shown}: not a Zarr hierarchy")
    if isinstance(root, BrokenNode) and root.kind == "array":  # the only node: nothing to mount
        raise UserError(f"{shown}: {root.error}")
    config = EngineConfig.for_mount(options, store)
    if config.drop_behind or options.writable:  # buffers freed behind readers or by stored writes: kept for the next
        allocator.keep_freed_buffers()
    engine = Engine(store, ChunkCache(options.cache_size_bytes), config)
    namespace = Namespace(
        hierarchy,
        root,
        source,
        engine,
        show_views=options.show_views,
        writable=options.writable,
        create_chunks=options.chunks,
        create_codec=options.codec,
        on_name_gone=invalidate_name,
        on_data_stale_sync=invalidate_data_sync,
        metadata_ttl_s=metadata_ttl_s,
    )
    log.info("opened %s as %s (root: %s)", shown, hierarchy.name, root.kind)
    return ZarrOperations(namespace, engine, options)


def open_store(source: str, storage_options: dict[str, Any], options: Options, shown: str) -> Store:
    """The store SOURCE names: a reference set (kerchunk, VirtualiZarr), or any fsspec URL; a
    backend that is not installed is a one-line error naming the extra that brings it."""
    try:
        refs = open_references_sync(
            source,
            storage_options,
            options.remote_protocol,
            options.remote_options,
            options.timeout_s,
            shown,
            options.authorize_virtual_chunk_access,
        )
        if refs is not None:
            return Store(source, fs=refs)
        if options.remote_protocol is not None or options.remote_options is not None:
            raise UserError(f"{shown}: remote_protocol and remote_options are for references only")
        store = Store(source, bounded_storage_options(source, storage_options, options.timeout_s))
        store.upload_part_bytes = options.upload_part_bytes
    except ImportError as e:
        remedy = missing_backend(e)
        if remedy is None:
            raise
        raise UserError(f"{shown}: {remedy}") from None
    bound_retries(store.fs)
    return store


def mount_metadata_ttl_s(source: str, options: Options, store: BaseStore) -> float:
    """The mount's metadata_ttl: the user's, else a branch of an Icechunk repository is checked for
    new commits as often as a remote store (one small read of the branch), else the store kind's."""
    if options.metadata_ttl_s is None and isinstance(store, icechunk.IcechunkStore) and store.follows_branch:
        return REMOTE_METADATA_TTL_S
    return default_metadata_ttl_s("reference://" if store.is_references else source, options.metadata_ttl_s)


def check_store(store: BaseStore, shown: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Raise a UserError naming why the store cannot be used, within `timeout_s` (the `timeout`
    option, at most START_TIMEOUT_S): the backend's own retries may take several times longer."""
    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            store.probe_sync(shown)
            outcome.append(None)
        except BaseException as e:  # handed to the waiting thread
            outcome.append(e)

    worker = threading.Thread(target=probe, name="zarrfs-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        raise UserError(f"{shown}: the store did not answer within {timeout_s:g} s (timed out)")
    if outcome[0] is not None:
        raise outcome[0]
