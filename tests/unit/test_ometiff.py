"""The OME-TIFF layout (zarrfs.views.ometiff, tiles, ngff) without FUSE: tifffile and ome-types as oracles."""

from __future__ import annotations

import io
import math
import random

import numpy as np
import pytest
import tifffile

from zarrfs import grid
from zarrfs.views import ngff, ometiff
from zarrfs.views.tiles import TileStream

from support.core import meta_and_chunks


def attrs(axes: str, n_levels: int, scale=None, units=None, channels=None, version="0.4") -> dict:
    scale = scale or [1.0] * len(axes)
    ms = {
        "version": version,
        "name": "img",
        "axes": [{"name": a, **({"unit": units[a]} if units and a in units else {})} for a in axes],
        "datasets": [
            {
                "path": str(i),
                "coordinateTransformations": [
                    {"type": "scale", "scale": [s * (2**i if a in "yx" else 1) for a, s in zip(axes, scale)]}
                ],
            }
            for i in range(n_levels)
        ],
    }
    doc = {"multiscales": [ms]}
    if channels:
        doc["omero"] = {"channels": [{"label": n, "color": c} for n, c in channels]}
    return {"ome": doc | {"version": version}} if version == "0.5" else doc


def pyramid(base: np.ndarray, n_levels: int, chunks: tuple) -> list[np.ndarray]:
    return [base[..., :: 2**i, :: 2**i] for i in range(n_levels)]


def build(arrays: list[np.ndarray], chunks: tuple, attributes: dict):
    """The OmeTiff of ARRAYS (levels) in CHUNKS, and a reader of its bytes [offset, offset+size)."""
    metas, chunk_sets = [], []
    for a in arrays:
        m, c = meta_and_chunks(a, chunks, "C")
        metas.append(m)
        chunk_sets.append(c)
    img = ngff.image(attributes)
    kept, notes = ngff.pyramid(img, metas)
    ome_type = ngff.pixel_type(kept[0].dtype)
    layout = ometiff.OmeTiff(
        kept, np.dtype(ngff.PIXEL_DTYPES[ome_type]), ngff.ome_xml(img, "img", kept[0].shape, ome_type)
    )

    def read(offset: int, size: int) -> bytes:
        out = []
        for part in layout.parts(offset, size):
            if isinstance(part, bytes):
                out.append(part)
            else:
                level, stream, off, n = part
                plan = stream.plan(off, n)
                out.append(bytes(stream.assemble(plan, {i: chunk_sets[level][i] for i in plan.chunks})))
        return b"".join(out)

    return layout, read, notes


CASES = [
    # (axes, shape, dtype, chunks, levels)
    ("yx", (70, 90), "<u2", (32, 40), 3),
    ("zyx", (3, 64, 64), ">f4", (2, 64, 64), 2),
    ("tczyx", (2, 3, 4, 50, 60), "|u1", (1, 2, 3, 20, 17), 3),
    ("cyx", (2, 16, 16), "<i2", (1, 16, 16), 1),
    ("tyx", (3, 33, 20), "<f2", (2, 33, 7), 2),
    ("yx", (40, 40), "|b1", (16, 16), 1),
    ("czyx", (2, 2, 30, 31), "<c8", (1, 1, 16, 16), 2),
]


@pytest.mark.parametrize("axes,shape,dtype,chunks,n_levels", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_tifffile_reads_every_level_tiled_with_subifds(axes, shape, dtype, chunks, n_levels):
    rng = np.random.default_rng(5)
    base = (rng.random(shape) * 100).astype(dtype)
    arrays = pyramid(base, n_levels, chunks)
    layout, read, notes = build(arrays, chunks, attrs(axes, n_levels))
    assert notes == []
    data = read(0, layout.size)
    assert len(data) == layout.size
    with tifffile.TiffFile(io.BytesIO(data)) as tf:
        assert tf.is_ome and tf.is_bigtiff
        series = tf.series[0]
        assert series.axes == axes.upper()
        assert len(series.levels) == n_levels
        assert len(tf.pages) == math.prod(shape[:-2])  # the reduced levels are SubIFDs, not pages
        for level, want in enumerate(arrays):
            got = series.levels[level].asarray()
            want = want.astype(np.uint8) if want.dtype.kind == "b" else want
            pixels = {"b": "u1", "f2": "f4"}.get(
                want.dtype.kind, {"f2": "f4"}.get(want.dtype.str[1:], want.dtype.str[1:])
            )
            assert got.shape == want.shape and got.dtype == np.dtype(pixels)
            np.testing.assert_array_equal(got, want)
    with tifffile.TiffFile(io.BytesIO(data)) as tf:
        tf.pages.useframes = False
        for page in tf.pages:
            assert page.is_tiled and page.tilewidth % 16 == 0 and page.tilelength % 16 == 0
            assert len(page.subifds or ()) == n_levels - 1
            assert page.subfiletype == 0
        if n_levels > 1:
            assert tf.series[0].levels[1].keyframe.subfiletype == 1
    # Any range reads as the same bytes taken from the whole file.
    rnd = random.Random(1)
    for _ in range(100):
        a = rnd.randrange(layout.size)
        n = rnd.randrange(1, 20000)
        assert read(a, n) == data[a : a + n], (a, n)


def test_ome_xml_validates_and_carries_sizes_units_and_channels():
    import ome_types

    a = attrs(
        "tczyx",
        1,
        scale=[2.5, 1.0, 0.8, 0.2, 0.3],
        units={"t": "millisecond", "z": "micrometer", "y": "micrometer", "x": "nanometer"},
        channels=[("DAPI", "0000FF"), ("GFP", "00FF00")],
        version="0.5",
    )
    img = ngff.image(a)
    ome = ome_types.from_xml(ngff.ome_xml(img, "img", (4, 2, 3, 10, 12), "uint16"), validate=True)
    px = ome.images[0].pixels
    assert (px.size_t, px.size_c, px.size_z, px.size_y, px.size_x) == (4, 2, 3, 10, 12)
    assert px.dimension_order.value == "XYZCT" and px.type.value == "uint16"
    assert (px.physical_size_x, px.physical_size_x_unit.value) == (0.3, "nm")
    assert (px.physical_size_z, px.physical_size_z_unit.value) == (0.8, "µm")
    assert (px.time_increment, px.time_increment_unit.value) == (2.5, "ms")
    assert [c.name for c in px.channels] == ["DAPI", "GFP"]
    assert [c.color.as_rgb_tuple() for c in px.channels] == [(0, 0, 255), (0, 255, 0)]
    assert px.tiff_data_blocks[0].plane_count == 24


def test_dimension_orders_follow_the_arrays_axes():
    assert ngff.dimension_order(tuple("tczyx")) == "XYZCT"
    assert ngff.dimension_order(tuple("czyx")) == "XYZCT"
    assert ngff.dimension_order(tuple("tcyx")) == "XYCTZ"
    assert ngff.dimension_order(tuple("tzyx")) == "XYZTC"
    assert ngff.dimension_order(tuple("yx")) == "XYZCT"


def test_levels_that_reduce_z_or_not_by_an_integer_are_left_out():
    base = np.zeros((8, 64, 64), "u1")
    arrays = [base, base[::2, ::2, ::2], base[:, ::3, ::3], base[:, ::4, ::4]]
    layout, read, notes = build(arrays, (4, 32, 32), attrs("zyx", 4))
    assert len(layout.streams) == 3  # 0, then 3 (by 3), then 4 (by 4)
    assert len(notes) == 1 and "level 1 " in notes[0]
    # ome-zarr-py's floor halving of odd sides: 100 x 120 -> ... -> 6 x 7 (by 16)
    assert ngff.reduction((100, 120), (6, 7)) == 16
    assert ngff.reduction((2, 100, 120), (1, 50, 60)) is None
    assert ngff.reduction((100, 120), (50, 40)) is None


@pytest.mark.parametrize("dtype", ["<u8", "<i8", "|S3"])
def test_types_ome_has_not_are_not_shown(dtype):
    with pytest.raises(ngff.NotShown, match="no pixel type"):
        ngff.pixel_type(np.dtype(dtype))


@pytest.mark.parametrize(
    "doc,why",
    [
        ({"multiscales": [{"axes": ["y", "x", "z"], "datasets": [{"path": "0"}]}]}, "end in y, x"),
        ({"multiscales": [{"axes": [{"name": "q", "type": "space"}, "y", "x"], "datasets": [{"path": "0"}]}]}, "q"),
        ({"multiscales": [{"axes": ["y", "x"], "datasets": [{"path": "../a"}]}]}, "within the group"),
        ({"multiscales": [{"datasets": [{"path": "0"}]}]}, "no axes"),
    ],
)
def test_malformed_ngff_is_refused_with_its_reason(doc, why):
    with pytest.raises(ngff.NotShown, match=why):
        ngff.image(doc)


def test_a_tile_plans_only_the_chunks_under_it():
    arr = np.zeros((2, 100, 130), "<u2")
    meta, _ = meta_and_chunks(arr, (1, 30, 50), "C")
    stream = TileStream(meta, 48, 64, np.dtype("<u2"))
    for plane, r, c in [(0, 0, 0), (1, 1, 1), (1, 2, 2), (0, 2, 0)]:
        plan = stream.plan(stream.tile_offset(plane, r, c), stream.tile_bytes)
        y0, y1 = r * 48, min((r + 1) * 48, 100)
        x0, x1 = c * 64, min((c + 1) * 64, 130)
        want = {
            (plane, cy, cx) for cy in range(y0 // 30, (y1 - 1) // 30 + 1) for cx in range(x0 // 50, (x1 - 1) // 50 + 1)
        }
        assert set(plan.chunks) == want


class LazyFile(io.RawIOBase):
    """A file object over an OmeTiff whose pixels are a formula (never held whole)."""

    def __init__(self, layout: ometiff.OmeTiff, value) -> None:
        self.layout, self.value, self.pos = layout, value, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.layout.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        out = []
        for part in self.layout.parts(self.pos, len(buf)):
            if isinstance(part, bytes):
                out.append(part)
            else:
                _, stream, off, n = part
                plan = stream.plan(off, n)
                chunks = {}
                for idx in plan.chunks:
                    sl = grid.chunk_slices(idx, stream.meta.shape, stream.meta.chunk_shape)
                    full = np.zeros(stream.meta.chunk_shape, stream.meta.dtype)
                    full[tuple(slice(0, s.stop - s.start) for s in sl)] = self.value(*np.ogrid[sl])
                    chunks[idx] = full
                out.append(bytes(stream.assemble(plan, chunks)))
        data = b"".join(out)
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def test_headers_of_a_million_tiles_are_made_from_offsets():
    from zarrfs.codecs.chain import CodecChain
    from zarrfs.model import ArrayMeta
    from zarrfs.storage.keys import ChunkKeys

    shape = (12, 4000, 6000)  # 12 planes of 250 x 375 tiles of 16 x 16: 1.1 million tiles

    def meta(path, shp):
        return ArrayMeta(
            path=path,
            shape=shp,
            dtype=np.dtype("u1"),
            chunk_shape=(1, 16, 16),
            fill_value=np.zeros((), "u1"),
            codec=CodecChain(),
            keys=ChunkKeys(path),
            attributes={},
            format="v2",
            metadata_key=path + "/.zarray",
        )

    levels = [meta("0", shape), meta("1", (12, 2000, 3000))]
    img = ngff.image(attrs("zyx", 2))
    layout = ometiff.OmeTiff(levels, np.dtype("u1"), ngff.ome_xml(img, "img", shape, "uint8"))
    assert layout.header_bytes > 12 * 250 * 375 * 8  # the tables alone: nothing of them is held
    assert len(layout._first) < 1024 and layout._template.nbytes < 1024

    def value(z, y, x):
        return ((z * 31 + y * 7 + x * 13) % 251).astype("u1")

    with tifffile.TiffFile(io.BufferedReader(LazyFile(layout, value), 1 << 16)) as tf:
        page = tf.pages[11]
        assert page.shape == (4000, 6000) and (page.tilelength, page.tilewidth) == (16, 16)
        offsets, counts = page.dataoffsets, page.databytecounts
        assert len(offsets) == 250 * 375
        fh = tf.filehandle
        for k in [0, 374, 375, 93749, 50000]:
            fh.seek(offsets[k])
            tile = np.frombuffer(fh.read(counts[k]), "u1").reshape(16, 16)
            r, c = divmod(k, 375)
            want = value(*np.ogrid[11:12, r * 16 : r * 16 + 16, c * 16 : c * 16 + 16])[0]
            np.testing.assert_array_equal(tile, want)
        assert len(page.subifds) == 1


def test_tiff_view_axes_and_resolution_read_by_tifffile():
    from zarrfs.views import tiff

    arr = np.arange(2 * 3 * 20 * 30, dtype="<u2").reshape(2, 3, 20, 30)
    hints = ngff.level_hints(
        attrs("tzyx", 2, scale=[1.0, 2.0, 0.5, 0.25], units={"y": "micrometer", "x": "nanometer"}), "1"
    )
    assert hints is not None and hints.axes == "TZYX"
    desc = tiff.description("/a", arr.shape, arr.dtype, {}, hints.axes)
    extra = tiff.resolution_tags(*ngff.resolution(hints))
    data = tiff.header(arr.dtype, arr.shape, desc, extra) + arr.tobytes()
    with tifffile.TiffFile(io.BytesIO(data)) as tf:
        assert tf.series[0].axes == "TZYX" and tf.series[0].shape == arr.shape
        page = tf.pages[0]
        assert page.resolutionunit == tifffile.RESUNIT.CENTIMETER
        # level 1: y 1 µm (0.5 x 2) per pixel, x 0.5 nm per pixel
        assert page.resolution == pytest.approx((1 / 0.5e-7, 1 / 1e-4), rel=1e-6)
        np.testing.assert_array_equal(tf.asarray(), arr)


def test_tiff_axes_of_dimension_names():
    assert ngff.tiff_axes(("time", "band", "lat", "lon")) == "TCYX"
    assert ngff.tiff_axes(("t", "x", "x")) == "TXQ"  # no letter twice
    assert ngff.tiff_axes(("station", None, "y", "x")) == "QQYX"
    assert ngff.tiff_axes((None, None)) is None and ngff.tiff_axes(None) is None


def test_any_shape_of_attributes_is_an_image_or_a_reason():
    """Attributes are data someone else wrote: whatever their shape, NotShown or an Image."""
    rnd = random.Random(4)
    atoms = [None, 0, -1, 2.5, "x", "y", "", "../a", [], {}, ["y", "x"], {"name": 3}, {"type": "time"}]

    def value(depth: int):
        if depth == 0 or rnd.random() < 0.3:
            return rnd.choice(atoms)
        if rnd.random() < 0.5:
            return [value(depth - 1) for _ in range(rnd.randrange(4))]
        keys = ["axes", "datasets", "path", "coordinateTransformations", "scale", "type", "name", "unit", "omero"]
        return {rnd.choice(keys): value(depth - 1) for _ in range(rnd.randrange(4))}

    shown = 0
    for _ in range(3000):
        axes = rnd.choice([["y", "x"], ["z", {"name": "y"}, {"name": "x", "unit": value(0)}], value(2)])
        datasets = rnd.choice([[{"path": "0", "coordinateTransformations": value(3)}], value(3)])
        ms = {"axes": axes, "datasets": datasets, "coordinateTransformations": value(3), "name": value(1)}
        doc = {"multiscales": [ms], "omero": {"channels": value(2)}}
        assert ngff.is_image(doc)
        try:
            img = ngff.image(doc)
        except ngff.NotShown:
            continue
        ngff.ome_xml(img, "x", (1,) * len(img.axes), "uint8")
        ngff.level_hints(doc, img.paths[0])
        shown += 1
    assert shown > 10  # some were images


@pytest.mark.parametrize(
    "shape,chunks,tile", [((2, 3, 50, 70), (1, 2, 16, 32), (16, 32)), ((3, 40, 41), (2, 30, 20), (32, 48))]
)
def test_chunk_end_is_past_the_last_tile_holding_the_chunk(shape, chunks, tile):
    """Each element holds its chunk's number (+1): in the assembled stream, a chunk's last
    element lies in the tile chunk_end closes (what a sequential reader passes it at)."""
    ids = np.zeros(shape, "<u4")
    for n, idx in enumerate(grid.all_chunks(shape, chunks)):
        ids[grid.chunk_slices(idx, shape, chunks)] = n + 1
    meta, chunk_arrays = meta_and_chunks(ids, chunks, "C")
    stream = TileStream(meta, *tile, np.dtype("<u4"))
    plan = stream.plan(0, stream.size)
    values = np.frombuffer(bytes(stream.assemble(plan, chunk_arrays)), "<u4")
    for n, idx in enumerate(grid.all_chunks(shape, chunks)):
        last = np.flatnonzero(values == n + 1)[-1]
        assert stream.chunk_end(idx) == (last // stream.tile_elems + 1) * stream.tile_bytes, idx


@pytest.mark.parametrize(
    "names,attributes,axes",
    [(("time", "y", "x"), {}, "TYX"), (None, {"_ARRAY_DIMENSIONS": ["band", "lat", "lon"]}, "CYX"), (None, {}, None)],
)
def test_tiff_view_axes_from_dimension_names_or_xarray_dimensions(names, attributes, axes):
    import dataclasses
    import json

    from zarrfs.views import images

    arr = np.arange(2 * 5 * 6, dtype="<i2").reshape(2, 5, 6)
    meta, chunks = meta_and_chunks(arr, (1, 5, 6), "C")
    meta = dataclasses.replace(meta, dimension_names=names, attributes=attributes)
    stream = images.tiff_stream(meta)
    data = stream.header + arr.tobytes()
    with tifffile.TiffFile(io.BytesIO(data)) as tf:
        assert json.loads(tf.pages[0].description).get("axes") == axes
        assert tf.series[0].axes == (axes or "QYX")


def test_64_bit_integers_take_the_32_bit_type_that_holds_their_values():
    assert ngff.pixel_type(np.dtype("<i8"), 0, 70000) == "uint32"
    assert ngff.pixel_type(np.dtype("<u8"), 3, 0xFFFFFFFF) == "uint32"
    assert ngff.pixel_type(np.dtype("<i8"), -5, 9) == "int32"
    with pytest.raises(ngff.NotShown, match=r"values 0..4294967296"):
        ngff.pixel_type(np.dtype("<u8"), 0, 1 << 32)
    with pytest.raises(ngff.NotShown, match="no pixel type for int64"):
        ngff.pixel_type(np.dtype("<i8"))  # not scanned (too large)


def test_a_narrowed_image_refuses_values_that_no_longer_fit():
    from zarrfs.errors import ZarrfsError

    labels = np.arange(16 * 20, dtype="<i8").reshape(16, 20)
    meta, chunks = meta_and_chunks(labels, (16, 16), "C")
    stream = TileStream(meta, 16, 16, np.dtype("<u4"), narrowed=True)
    plan = stream.plan(0, stream.size)
    got = np.frombuffer(bytes(stream.assemble(plan, chunks)), "<u4").reshape(2, 16, 16)
    np.testing.assert_array_equal(got[0], labels[:, :16])
    chunks[(0, 1)][3, 2] = 1 << 33  # written since the layout
    with pytest.raises(ZarrfsError, match="no longer fit"):
        stream.assemble(plan, chunks)
