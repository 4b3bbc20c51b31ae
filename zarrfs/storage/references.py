"""Reference sets (kerchunk, VirtualiZarr) as stores: tell a SOURCE that names one, and open it.

A reference set maps Zarr keys to inline bytes or to byte ranges of other files (netCDF4 and
HDF5 archives); fsspec's reference file system serves it. The reference file is read once,
here; the byte ranges are read on demand, each a ranged read of its file. Pure: no trio.
"""

from __future__ import annotations

import json
import os
from importlib.util import find_spec
from typing import Any

import fsspec
from fsspec.implementations.reference import LazyReferenceMapper, ReferenceFileSystem

from ..errors import UserError
from .failures import describe_failure
from .remote import (
    REMOTE_PROTOCOLS,
    bound_retries,
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


def open_references_sync(
    source: str,
    storage_options: dict[str, Any],
    remote_protocol: str | None,
    remote_options: dict[str, Any] | None,
    timeout_s: float,
    shown: str,
) -> ReferenceFileSystem | None:
    """The reference file system SOURCE names, or None when SOURCE is not a reference set.

    SOURCE names one as `reference://` with `fo` in STORAGE_OPTIONS (fsspec's spelling), as a
    `.json` file, or as a `.parq` / `.parquet` directory of Parquet references. For a file SOURCE,
    STORAGE_OPTIONS are its own file system's, and also the data files' when they are on the same
    protocol and REMOTE_OPTIONS is None. SHOWN is SOURCE as messages show it.
    """
    kwargs: dict[str, Any] = {}
    if protocol_of(source) == "reference":
        kwargs = {k: v for k, v in storage_options.items() if k not in READ_HERE}
        fo = storage_options.get("fo")
        target_options = storage_options.get("target_options") or storage_options.get("ref_storage_args") or {}
        target_protocol = storage_options.get("target_protocol")
        if isinstance(fo, str) and target_protocol and "://" not in fo:
            fo = f"{target_protocol}://{fo}"
        remote_protocol = remote_protocol or storage_options.get("remote_protocol")
        if remote_options is None:
            remote_options = storage_options.get("remote_options")
        if isinstance(fo, dict):
            references: Any = _checked(fo, shown)
        elif isinstance(fo, str):
            references = _read_sync(*_file_system(fo, target_options, timeout_s, shown), None, shown)
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
    target = _first_target(references)
    if target is not None and "://" not in target and not os.path.isabs(target):
        raise UserError(
            f"{shown}: the references name their data file by a relative path ({target}): "
            f"make them with its absolute path or URL"
        )
    # Given here rather than left to fsspec: it would look for it in the references again, and
    # stop at the padding rows of Parquet references (a missing path reads as NaN).
    protocol = remote_protocol or (fsspec.core.split_protocol(target)[0] if target else None) or "file"
    if protocol in REMOTE_PROTOCOLS:
        if remote_options is None and protocol_of(source) == protocol:
            remote_options = storage_options  # the same store's credentials and endpoint
        remote_options = bounded_storage_options(f"{protocol}://", remote_options or {}, timeout_s)
    fs = ReferenceFileSystem(references, remote_protocol=protocol, remote_options=remote_options or {}, **kwargs)
    for target_fs in fs.fss.values():
        bound_retries(target_fs)
    return fs


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
    """DOC when it is fsspec references (version 1, or version 0: keys straight to values)."""
    if not isinstance(doc, dict):
        raise UserError(f"{shown}: not fsspec references (not a JSON object)")
    if "version" in doc:
        if doc["version"] != 1 or not isinstance(doc.get("refs"), dict):
            raise UserError(
                f"{shown}: references of version {doc['version']!r} without `refs`: zarrfs reads versions 0 and 1"
            )
        return doc
    if "zarr_format" in doc or "zarr_consolidated_format" in doc:
        raise UserError(f"{shown}: a Zarr metadata document, not references: mount the directory holding it")
    if not any(str(key).rsplit("/", 1)[-1] in ZARR_DOCUMENTS for key in doc):
        raise UserError(f"{shown}: not fsspec references (no `version` and `refs`, no Zarr metadata keys)")
    return doc


def _first_target(references: Any) -> str | None:
    """The URL of the first data file the references name (templates filled in), or None."""
    templates: dict[str, Any] = {}
    if isinstance(references, dict) and references.get("version") == 1:
        templates = references.get("templates") or {}
        references = references["refs"]
    for value in references.values():
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], str) and value[0]:
            url = value[0]
            if "{{" in url:
                try:
                    url = url.replace("{{", "{").replace("}}", "}").format(**templates)
                except (KeyError, IndexError, ValueError):
                    pass
            return url
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
