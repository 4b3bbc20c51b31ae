"""The kinds of file and directory a mount shows: one enum, named by the views and the tree."""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """What an entry is; its value is the word log lines and error messages use."""

    GROUP = "group"  # a group's directory (main tree and views)
    ARRAY = "array"  # an array's NAME.npy (main tree), npy-f, raw, raw-f file
    VIEWS = "views"  # the .zarrfs directory
    CHUNKDIR = "chunkdir"  # chunks/PATH: one file per grid position
    CHUNK = "chunk"  # chunks/PATH/I.J.npy
    STOREDIR = "storedir"  # a prefix of store/
    STOREKEY = "storekey"  # a store key under store/, byte for byte
    INFO = "info"  # info/PATH.json
    STATS = "stats"  # stats.json, and refresh (view "refresh")
    PLAIN = "plain"  # a plain file: any name but NAME.npy (tree/plain.py)
    SLICE = "slice"  # slice/BASE[SEL].npy
    NETCDF = "netcdf"  # a group's netCDF file
    TIFF = "tiff"  # tiff/PATH.tif
    OMETIFF = "ome-tiff"  # ome-tiff/IMAGE.ome.tif: an OME-Zarr image group as a pyramidal OME-TIFF
    TEXT = "text"  # ENVI raw/PATH.hdr, gdal/PATH.vrt
    PAM = "pam"  # GDAL's raw/PATH.raw.aux.xml
    PREVIEW = "preview"  # preview/PATH.png
    VERSIONS = "versions"  # a directory of versions/ (versions.py)
    VERSIONLOG = "versionlog"  # versions/log.json

    def __str__(self) -> str:
        return self.value


# Kinds that are directories.
DIR_KINDS = frozenset({Kind.GROUP, Kind.VIEWS, Kind.CHUNKDIR, Kind.STOREDIR, Kind.VERSIONS})
# Data files that writes go to (the .npy tree, npy-f, raw, raw-f, chunk files, held files).
WRITABLE_KINDS = frozenset({Kind.ARRAY, Kind.CHUNK, Kind.PLAIN})
# Files whose bytes are an array's elements in some layout (an ArrayStream).
ARRAY_FILE_KINDS = frozenset({Kind.ARRAY, Kind.CHUNK, Kind.TIFF, Kind.SLICE})
