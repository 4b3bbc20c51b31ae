"""OME-Zarr stores written by their own writers (ome-zarr-py, ngff-zarr) for the ome-tiff view's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# What every 5-D image of these stores holds: t, c, z, y, x, and its level 0's scale and units.
SHAPE_5D = (2, 3, 4, 100, 120)
SCALE_5D = {"t": 2.0, "z": 0.5, "y": 0.25, "x": 0.25}
UNITS_5D = {"t": "second", "z": "micrometer", "y": "micrometer", "x": "micrometer"}
CHANNELS = [("DAPI", "0000FF"), ("GFP", "00FF00"), ("RFP", "FF0000")]


def _omero(root, version: str) -> None:
    omero = {"channels": [{"label": n, "color": c, "window": {"start": 0, "end": 4000}} for n, c in CHANNELS]}
    if version == "0.5":
        ome = dict(root.attrs["ome"])
        root.attrs["ome"] = {**ome, "omero": omero}
    else:
        root.attrs["omero"] = omero


def ome_zarr_image(path: Path, version: str, seed: int = 1) -> dict[str, np.ndarray]:
    """A 5-D uint16 image with three levels, channels and labels `cells` (uint16, z, y, x),
    `nuclei` (int64 of small values) and `ids` (uint64 past 2^32, which OME-TIFF cannot hold),
    written by ome-zarr-py; {label name: data}."""
    import zarr
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.writer import write_image, write_labels

    fmt = FormatV04() if version == "0.4" else FormatV05()
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 4000, SHAPE_5D).astype("u2")
    root = zarr.open_group(str(path), mode="w", zarr_format=2 if version == "0.4" else 3)
    write_image(
        data,
        root,
        scale_factors=(2, 4),
        fmt=fmt,
        axes="tczyx",
        storage_options={"chunks": (1, 1, 1, 64, 64)},
        scale=SCALE_5D,
        axes_units=UNITS_5D,
    )
    _omero(root, version)
    cells = (rng.random(SHAPE_5D[2:]) * 5).astype("u2")
    nuclei = (rng.random(SHAPE_5D[2:]) * 7).astype("i8")  # skimage.measure.label's type: int64
    ids = (rng.random(SHAPE_5D[2:]) * 5).astype("u8") + (1 << 40)
    for name, labels in (("cells", cells), ("nuclei", nuclei), ("ids", ids)):
        write_labels(labels, root, name=name, fmt=fmt, axes="zyx", scale_factors=(2,))
    return {"cells": cells, "nuclei": nuclei, "ids": ids}


def ngff_zarr_images(root: Path, version: str) -> None:
    """`yx.zarr` (2-D, three levels by 2 and 4 in y and x), `zyx.zarr` (3-D, levels that also
    reduce z, as ngff-zarr's defaults do), `zyx2.zarr` (the same reduced in y and x only) and,
    for 0.5, `sharded.zarr` (the same in shards), written by ngff-zarr."""
    import ngff_zarr as nz

    rng = np.random.default_rng(3)
    flat = nz.to_ngff_image(
        rng.random((130, 150)).astype("f4"),
        dims=["y", "x"],
        scale={"y": 0.5, "x": 0.5},
        axes_units={"y": "micrometer", "x": "micrometer"},
        name="flat",
    )
    nz.to_ngff_zarr(
        str(root / "yx.zarr"),
        nz.to_multiscales(flat, scale_factors=[2, 4], chunks=64),
        version=version,
    )
    stack = nz.to_ngff_image(
        rng.integers(0, 255, (8, 64, 80)).astype("u1"),
        dims=["z", "y", "x"],
        scale={"z": 2.0, "y": 0.5, "x": 0.5},
        axes_units={"z": "micrometer", "y": "micrometer", "x": "micrometer"},
    )
    nz.to_ngff_zarr(str(root / "zyx.zarr"), nz.to_multiscales(stack, scale_factors=[2], chunks=32), version=version)
    in_plane = [{"z": 1, "y": 2, "x": 2}, {"z": 1, "y": 4, "x": 4}]  # y and x only: a TIFF pyramid
    nz.to_ngff_zarr(
        str(root / "zyx2.zarr"), nz.to_multiscales(stack, scale_factors=in_plane, chunks=32), version=version
    )
    if version == "0.5":  # v3 shards of 2 x 2 x 2 chunks: tiles of the inner chunks
        ms = nz.to_multiscales(stack, scale_factors=in_plane, chunks=16)
        nz.to_ngff_zarr(str(root / "sharded.zarr"), ms, version=version, chunks_per_shard=2)


def ome_zarr_plate(path: Path) -> dict[str, np.ndarray]:
    """An HCS plate of wells A/1 and B/2, two fields each (c, y, x uint8), written by ome-zarr-py
    (NGFF 0.4); {field path: data}."""
    import zarr
    from ome_zarr.format import FormatV04
    from ome_zarr.writer import write_image, write_plate_metadata, write_well_metadata

    fmt = FormatV04()
    rng = np.random.default_rng(9)
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    write_plate_metadata(root, ["A", "B"], ["1", "2"], ["A/1", "B/2"], fmt=fmt, field_count=2)
    fields = {}
    for well in ("A/1", "B/2"):
        row, col = well.split("/")
        group = root.require_group(row).require_group(col)
        write_well_metadata(group, ["0", "1"], fmt=fmt)
        for field in ("0", "1"):
            data = rng.integers(0, 255, (2, 48, 40)).astype("u1")
            write_image(data, group.require_group(field), scale_factors=(2,), fmt=fmt, axes="cyx")
            fields[f"{well}/{field}"] = data
    return fields
