"""Reference sets (kerchunk, VirtualiZarr) as stores: tell a SOURCE that names one, and open it.

A reference set maps Zarr keys to inline bytes or to byte ranges of other files (netCDF4 and
HDF5 archives). The reference file is read once, here, into a table (refspec.py: every entry
checked, templates and `gen` expanded) or, for Parquet, fsspec's lazy mapping of it; the byte
ranges are read on demand through reffs.py, where the mount trusts them (reftrust.py). Pure:
no trio.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from importlib.util import find_spec
from typing import Any

import fsspec
from fsspec.implementations.reference import LazyReferenceMapper

from ..errors import UserError
from .failures import describe_failure
from .reffs import ReferenceSet, TargetFileSystems
from .refspec import references_table, target_problem
from .reftrust import Trust, origin
from .remote import (
    GCS_PROTOCOLS,
    HTTP_PROTOCOLS,
    S3_PROTOCOLS,
    bounded_storage_options,
    missing_backend,
    protocol_of,
)

# What a SOURCE naming a reference file ends with: kerchunk's JSON, and its Parquet directories.
JSON_SUFFIX = ".json"
PARQUET_SUFFIXES = (".parq", ".parquet")
# Parquet references are read with pandas through pyarrow: pandas deprecates fsspec's default
# engine (fastparquet). Files either engine wrote read the same.
PARQUET_ENGINE = "pyarrow"
PARQUET_MODULES = ("pandas", PARQUET_ENGINE)
# What netCDF4 and HDF5 files are called: mounted as SOURCE, they get a pointer to references.
ARCHIVE_SUFFIXES = (".nc", ".nc4", ".h5", ".hdf5", ".he5")
# Keys a Zarr hierarchy's references hold: a JSON object with none of them is not references.
ZARR_DOCUMENTS = (".zgroup", ".zarray", ".zattrs", ".zmetadata", "zarr.json")
# Options of fsspec's reference file system that zarrfs sets itself from its own options.
READ_HERE = ("fo", "target_options", "ref_storage_args", "target_protocol", "remote_protocol", "remote_options")
# Options of fsspec's reference file system passed on as they are; the others (`fs`, `target`,
# templates given apart) would change what the references say, unseen by the checks here.
PASSED_ON = ("cache_size", "max_gap", "max_block", "skip_instance_cache")


def open_references_sync(
    source: str,
    storage_options: dict[str, Any],
    remote_protocol: str | None,
    remote_options: dict[str, Any] | None,
    timeout_s: float,
    shown: str,
    authorized: tuple[str, ...] = (),
) -> ReferenceSet | None:
    """The reference set SOURCE names, or None when SOURCE is not a reference set.

    SOURCE names one as `reference://` with `fo` in STORAGE_OPTIONS (fsspec's spelling), as a
    `.json` file, or as a `.parq` / `.parquet` directory of Parquet references. For a file SOURCE,
    STORAGE_OPTIONS are its own file system's, and also the data files' on the same protocol
    (REMOTE_OPTIONS, when given, are those of REMOTE_PROTOCOL or else of the first data file's).
    AUTHORIZED: prefixes the data files may lie under beyond the defaults (reftrust.py). SHOWN is
    SOURCE as messages show it.
    """
    kwargs: dict[str, Any] = {}
    reference_url: str | None = source
    reference_options = storage_options
    if protocol_of(source) == "reference":
        kwargs = {k: v for k, v in storage_options.items() if k not in READ_HERE}
        unknown = sorted(set(kwargs) - set(PASSED_ON))
        if unknown:
            raise UserError(f"{shown}: options of the reference file system zarrfs does not take: {', '.join(unknown)}")
        fo = storage_options.get("fo")
        reference_options = storage_options.get("target_options") or storage_options.get("ref_storage_args") or {}
        target_protocol = storage_options.get("target_protocol")
        if isinstance(fo, str) and target_protocol and "://" not in fo:
            fo = f"{target_protocol}://{fo}"
        remote_protocol = remote_protocol or storage_options.get("remote_protocol")
        if remote_options is None:
            remote_options = storage_options.get("remote_options")
        if isinstance(fo, dict):
            references: Any = _checked(fo, shown)
            reference_url = None  # given by the user, on the command line
        elif isinstance(fo, str):
            reference_url = fo
            references = _read_sync(*_file_system(fo, reference_options, timeout_s, shown), None, shown)
        else:
            raise UserError(
                f'{shown}: give the references as storage_options={{"fo": "PATH or URL"}}, '
                f"or name the reference file as SOURCE"
            )
    else:
        named = _named_sync(source, storage_options, timeout_s, shown)
        if named is None:
            if _local_archive(source):
                raise UserError(
                    f"{shown}: a netCDF4/HDF5 file, not a Zarr store: mount kerchunk's references "
                    f"of it (docs/REMOTE.md: References)"
                )
            return None
        references = _read_sync(*named, shown)
    if remote_protocol is not None:
        remote_protocol = remote_protocol.lower()
    first_protocol = remote_protocol or _first_remote_protocol(references)
    reference_protocol = protocol_of(reference_url) if reference_url is not None else None
    reference_origin = origin(reference_url)

    def options_for(protocol: str, url_origin: str | None) -> tuple[str, dict[str, Any]]:
        if remote_options is not None and _family(protocol) == _family(first_protocol):
            return "remote_options", remote_options
        if reference_protocol not in (None, "file") and _family(protocol) == _family(reference_protocol):
            if protocol in HTTP_PROTOCOLS and url_origin != reference_origin:
                return "", {}  # a web server's headers and credentials go to that server only
            return "storage_options", reference_options  # the same store's credentials and endpoint
        return "", {}

    targets = TargetFileSystems(options_for, timeout_s)
    if isinstance(references, dict):  # every target checked now: a bad one fails the mount, not a read
        protocols = set()
        for key, value in references.items():
            if isinstance(value, list):
                problem = target_problem(value[0], remote_protocol)
                if problem is not None:
                    raise UserError(f"{shown}: reference {key!r}: {problem}")
                protocols.add((fsspec.core.split_protocol(value[0])[0] or remote_protocol or "file").lower())
        for protocol in sorted(protocols):
            try:
                targets.make_sync(protocol)
            except UserError as e:
                raise UserError(f"{shown}: {e}") from None
    trust = Trust(reference_url, authorized, remote_protocol, _endpoint_host(reference_options))
    return ReferenceSet(references, trust, targets, **kwargs)


def _endpoint_host(options: dict[str, Any]) -> str | None:
    """The host of the endpoint an object store's options name (`endpoint_url`), or None."""
    client = options.get("client_kwargs")
    endpoint = options.get("endpoint_url") or (client.get("endpoint_url") if isinstance(client, dict) else None)
    return urllib.parse.urlsplit(endpoint).hostname if isinstance(endpoint, str) else None


def _family(protocol: str | None) -> tuple[str, ...] | None:
    """The protocols that name the same kind of store as PROTOCOL (`s3` and `s3a`, `http` and `https`)."""
    if protocol is None:
        return None
    for family in (S3_PROTOCOLS, HTTP_PROTOCOLS, GCS_PROTOCOLS):
        if protocol in family:
            return family
    return (protocol,)


def _local_archive(source: str) -> bool:
    """Whether SOURCE is a local file named as netCDF4 and HDF5 files are."""
    return (
        protocol_of(source) == "file"
        and source.lower().endswith(ARCHIVE_SUFFIXES)
        and os.path.isfile(source.removeprefix("file://"))
    )


def _named_sync(
    source: str, storage_options: dict[str, Any], timeout_s: float, shown: str
) -> tuple[Any, str, str] | None:
    """(file system, path, `json` or `parquet`) when SOURCE names a reference file by its suffix
    (and is one), else None: a directory called `x.json` and a Zarr store called `x.parq` stay stores."""
    if "::" in source:
        return None
    name = source.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0].lower()
    if not name.endswith((JSON_SUFFIX, *PARQUET_SUFFIXES)):
        return None
    fs, path = _file_system(source, storage_options, timeout_s, shown)
    try:
        if name.endswith(JSON_SUFFIX):
            return (fs, path, "json") if fs.isfile(path) else None
        if not fs.isdir(path):
            return None
        zmetadata = json.loads(fs.cat_file(path.rstrip("/") + "/.zmetadata"))
    except (FileNotFoundError, ValueError):
        return None
    except Exception as e:
        raise UserError(f"{shown}: {describe_failure(e)}") from None
    return (fs, path, "parquet") if isinstance(zmetadata, dict) and "record_size" in zmetadata else None


def _file_system(url: str, storage_options: dict[str, Any], timeout_s: float, shown: str) -> tuple[Any, str]:
    """The file system and path of URL, with the backend's waits bounded."""
    try:
        return fsspec.core.url_to_fs(
            url, skip_instance_cache=True, **bounded_storage_options(url, storage_options, timeout_s)
        )
    except ImportError as e:
        raise UserError(f"{shown}: {missing_backend(e) or e}") from None
    except (ValueError, TypeError) as e:
        raise UserError(f"{shown}: cannot open the references: {e}") from None


def _read_sync(fs: Any, path: str, kind: str | None, shown: str) -> Any:
    """The references at PATH of FS: a dict (JSON), or a lazy mapping of Parquet references (read
    as keys are asked). KIND None: Parquet when PATH is a directory, as fsspec decides."""
    try:
        if kind is None:
            kind = "parquet" if path.endswith(PARQUET_SUFFIXES) or fs.isdir(path) else "json"
        if kind == "parquet":
            for module in PARQUET_MODULES:
                if find_spec(module) is None:
                    raise UserError(f"{shown}: {missing_backend(ModuleNotFoundError(name=module))}")
            mapper = ParquetReferences(path.rstrip("/"), fs=fs, engine=PARQUET_ENGINE)
            mapper.setup()  # reads .zmetadata now: a bad one is an error at start, not at a read
            return mapper
        raw = fs.cat_file(path)
    except UserError:
        raise
    except FileNotFoundError:
        raise UserError(f"{shown}: no such reference file") from None
    except (ValueError, KeyError, TypeError) as e:  # a .zmetadata without kerchunk's fields
        raise UserError(f"{shown}: not references ({type(e).__name__}: {e})") from None
    except Exception as e:
        raise UserError(f"{shown}: reading the references failed: {describe_failure(e)}") from None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{shown}: the reference file is not JSON ({e})") from None
    return _checked(doc, shown)


def _checked(doc: Any, shown: str) -> dict[str, Any]:
    """The table of DOC when it is fsspec references (version 1, or version 0: keys straight to values)."""
    if isinstance(doc, dict) and "version" not in doc:
        if "zarr_format" in doc or "zarr_consolidated_format" in doc:
            raise UserError(f"{shown}: a Zarr metadata document, not references: mount the directory holding it")
        if not any(str(key).rsplit("/", 1)[-1] in ZARR_DOCUMENTS for key in doc):
            raise UserError(f"{shown}: not fsspec references (no `version` and `refs`, no Zarr metadata keys)")
    return references_table(doc, shown)


def _first_remote_protocol(references: Any) -> str | None:
    """The protocol of the first data file not on the local file system (Parquet references: of the
    first data file, not to read every record file at mount), or None."""
    for value in references.values():
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], str) and value[0]:
            protocol = fsspec.core.split_protocol(value[0])[0]
            if protocol not in (None, "file", "local") or not isinstance(references, dict):
                return protocol
    return None


class ParquetReferences(LazyReferenceMapper):
    """fsspec's lazily read Parquet references, where a chunk without a data file is absent.

    A chunk the references leave out has a row with no path, which pandas reads as NaN: fsspec
    would take that for the URL of a whole file, and fail the read instead of giving the fill value.
    """

    def _load_one_key(self, key: str) -> Any:
        value = super()._load_one_key(key)
        if isinstance(value, list) and not isinstance(value[0], str):
            raise KeyError(key)
        return value
