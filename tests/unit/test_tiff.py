"""TIFF headers (zarrfs.views.tiff) and the image views' layouts and texts (zarrfs.views.images), with tifffile as
the oracle."""

import io
import math

import numpy as np
import pytest
import tifffile

from zarrfs.views import images, tiff

from support.core import meta_and_chunks

CASES = [
    ((5, 7), "|u1"),
    ((3, 5, 7), ">f4"),
    ((2, 3, 4, 5), "<c8"),
    ((300, 2000), "<f8"),
    ((4, 4), "|b1"),
    ((2, 3, 9), "<i8"),
    ((6, 6), ">u2"),
    ((3, 8, 8), "<f2"),
    ((2, 2, 2), ">c16"),
    ((1, 1), "|i1"),
]


def tiff_file(arr: np.ndarray, desc: str = "") -> bytes:
    pixels = tiff.pixel_dtype(arr.dtype)
    return tiff.header(pixels, arr.shape, desc) + arr.astype(pixels).tobytes()


def sample(shape, dtype) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (rng.random(shape) * 200).astype(np.dtype(dtype))


@pytest.mark.parametrize("shape,dtype", CASES, ids=[f"{s}-{d}" for s, d in CASES])
def test_tifffile_reads_header_then_c_order_bytes(shape, dtype):
    arr = sample(shape, dtype)
    desc = tiff.description("/g/a", arr.shape, arr.dtype, {"units": "m", "nan": float("nan")})
    data = tiff_file(arr, desc)
    with tifffile.TiffFile(io.BytesIO(data)) as tf:
        assert len(tf.pages) == math.prod(shape[:-2])
        assert not tf.is_bigtiff
        got = tf.asarray()
        assert tf.pages[0].description.startswith('{"shape": ')
        assert tf.pages[0].compression == 1
    want = arr.astype(np.uint8) if arr.dtype.kind == "b" else arr
    assert got.shape == want.shape and got.dtype == want.dtype.newbyteorder("<")
    np.testing.assert_array_equal(got, want)


def test_pixels_start_on_a_page_boundary_after_every_ifd():
    arr = sample((3, 40, 30), "<u2")
    head = tiff.header(arr.dtype, arr.shape)
    assert len(head) % 4096 == 0
    with tifffile.TiffFile(io.BytesIO(head + arr.tobytes())) as tf:
        offsets = [o for p in tf.pages for o in p.dataoffsets]
        page_bytes = 40 * 30 * 2
        assert [p.dataoffsets[0] for p in tf.pages] == [len(head) + k * page_bytes for k in range(3)]
        assert min(offsets) == len(head)


def test_long_pages_are_cut_in_strips():
    arr = sample((2, 1000, 300), "<f8")  # 2.4 MB a page: three strips of about 1 MiB
    with tifffile.TiffFile(io.BytesIO(tiff_file(arr))) as tf:
        assert [len(p.dataoffsets) for p in tf.pages] == [3, 3]
        np.testing.assert_array_equal(tf.asarray(), arr)


def test_bigtiff_past_4_gib(monkeypatch):
    monkeypatch.setattr(tiff, "CLASSIC_MAX_BYTES", 1000)  # the same rule, reached by a small array
    arr = sample((3, 20, 30), "<i4")
    with tifffile.TiffFile(io.BytesIO(tiff_file(arr))) as tf:
        assert tf.is_bigtiff
        np.testing.assert_array_equal(tf.asarray(), arr)


def test_header_of_a_5_gib_array_is_bigtiff():
    shape = (5, 32768, 32768)  # 5 GiB of uint8
    head = tiff.header(np.dtype("u1"), shape)
    assert head[:4] == b"II+\0"
    with tifffile.TiffFile(io.BytesIO(head)) as tf:  # IFDs only; pixels are not read
        last = tf.pages[-1]
        assert last.shape == (32768, 32768)
        assert last.dataoffsets[-1] + last.databytecounts[-1] == len(head) + math.prod(shape)


def test_large_attributes_are_left_out_of_the_description():
    desc = tiff.description("/a", (2, 2), np.dtype("u1"), {"big": "x" * (tiff.MAX_DESCRIPTION_BYTES + 1)})
    assert len(desc) < tiff.MAX_DESCRIPTION_BYTES and '"attributes": null' in desc


@pytest.mark.parametrize(
    "shape,dtype", [((5,), "u1"), ((0, 4), "u1"), ((3, 3), "S3"), ((3, 3), "M8[s]"), ((2, 2), [("a", "u1")])]
)
def test_unsupported_arrays_get_no_tiff(shape, dtype):
    assert not tiff.supported(np.dtype(dtype), shape)


def test_millions_of_pages_get_no_tiff():
    assert not tiff.header_fits(np.dtype("u1"), (10_000_000, 2, 2))
    assert tiff.header_fits(np.dtype("u1"), (10_000, 2, 2))


def test_reading_one_page_plans_only_that_pages_chunks():
    arr = np.arange(4 * 20 * 20, dtype="<f4").reshape(4, 20, 20)
    meta, _ = meta_and_chunks(arr, (1, 10, 10), "C")
    stream = images.tiff_stream(meta)
    page = 20 * 20 * 4
    plan = stream.plan(len(stream.header) + 2 * page, page)
    assert set(plan.chunks) == {(2, i, j) for i in range(2) for j in range(2)}


def test_tiff_stream_serves_what_tifffile_reads():
    arr = sample((3, 7, 9), ">i2")
    meta, chunks = meta_and_chunks(arr, (2, 3, 4), "F")
    stream = images.tiff_stream(meta)
    plan = stream.plan(0, stream.size)
    data = stream.assemble(plan, {idx: chunks[idx] for idx in plan.chunks})
    assert len(data) == stream.size
    np.testing.assert_array_equal(tifffile.imread(io.BytesIO(data)), arr)


def test_envi_header_and_vrt_texts():
    meta, _ = meta_and_chunks(np.zeros((3, 5, 7), ">i4"), (1, 5, 7), "C")
    hdr = images.envi_header(meta).decode()
    for line in (
        "samples = 7",
        "lines = 5",
        "bands = 3",
        "data type = 3",
        "byte order = 1",
        "interleave = bsq",
        "header offset = 0",
    ):
        assert line in hdr.splitlines()
    vrt = images.vrt(meta, "a.npy").decode()
    assert vrt.count("VRTRawRasterBand") == 3 and "<ByteOrder>MSB</ByteOrder>" in vrt
    assert f"<ImageOffset>{128 + 2 * 5 * 7 * 4}</ImageOffset>" in vrt


def _gdal_copy(tmp_path, meta, arr, statistics=None):
    """A view's VRT at .zarrfs/gdal/a.vrt beside the array's np.save file, as in a mount."""
    np.save(tmp_path / "a.npy", arr)
    vrt = tmp_path / ".zarrfs" / "gdal" / "a.vrt"
    vrt.parent.mkdir(parents=True)
    vrt.write_bytes(images.vrt(meta, "a.npy", statistics))
    return vrt


def _gdal(*cmd):
    import shutil
    import subprocess

    if shutil.which(cmd[0]) is None:
        pytest.fail(f"{cmd[0]} is not installed (scripts/test.sh installs it with apt)")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r


def test_vrt_statistics_are_what_gdal_saves_into_a_vrt(tmp_path):
    """GDAL (gdalinfo -stats) rewrites a VRT with STATISTICS_* band metadata: those are taken
    as the view's statistics (numpy's values); written into the view's text, GDAL prints them
    without writing the file again."""
    arr = (np.random.default_rng(3).random((3, 6, 5)) * 100).astype(">f4")
    meta, _ = meta_and_chunks(arr, (1, 6, 5), "C")
    vrt = _gdal_copy(tmp_path, meta, arr)
    _gdal("gdalinfo", "-stats", str(vrt))
    stats = images.vrt_statistics(vrt.read_bytes(), meta, "a.npy")
    assert stats is not None and len(stats) == 3
    for band, st in zip(arr.astype("f8"), stats):
        for key, want in (
            ("MINIMUM", band.min()),
            ("MAXIMUM", band.max()),
            ("MEAN", band.mean()),
            ("STDDEV", band.std()),
        ):
            assert float(st["STATISTICS_" + key]) == pytest.approx(want, rel=1e-6)
    again = vrt.with_name("b.vrt")
    again.write_bytes(images.vrt(meta, "a.npy", stats))
    before = again.read_bytes()
    r = _gdal("gdalinfo", "-stats", str(again))
    assert again.read_bytes() == before and "ERROR" not in r.stderr
    assert r.stdout.count("STATISTICS_MEAN=") == 3


@pytest.mark.parametrize("edit", [["-a_nodata", "0"], ["-mo", "KEY=VALUE"], ["-a_srs", "EPSG:4326"]])
def test_vrt_statistics_refuse_other_changes(tmp_path, edit):
    arr = np.arange(30, dtype="<u2").reshape(6, 5)
    meta, _ = meta_and_chunks(arr, (6, 5), "C")
    vrt = _gdal_copy(tmp_path, meta, arr)
    _gdal("gdal_edit.py", *edit, str(vrt))
    assert vrt.read_bytes() != images.vrt(meta, "a.npy")
    assert images.vrt_statistics(vrt.read_bytes(), meta, "a.npy") is None
    assert images.vrt_statistics(b"not xml", meta, "a.npy") is None
    assert images.vrt_statistics(b"<VRTDataset/>", meta, "a.npy") is None


def _raw_copy(tmp_path, meta, arr, statistics=None):
    """A raw view with its ENVI header and, when given, its .aux.xml, as in a mount."""
    raw = tmp_path / "a.raw"
    raw.write_bytes(arr.tobytes())
    (tmp_path / "a.hdr").write_bytes(images.envi_header(meta))
    if statistics is not None:
        (tmp_path / "a.raw.aux.xml").write_bytes(images.pam(meta, statistics))
    return raw


def test_pam_statistics_are_what_gdal_saves_beside_a_raw_view(tmp_path):
    """GDAL saves the statistics of an ENVI raw file into PATH.raw.aux.xml (with the metadata it
    read from the header): the statistics are numpy's; given back in an .aux.xml, GDAL prints
    them without writing it again; an empty one it reads as nothing."""
    arr = (np.random.default_rng(4).random((2, 7, 9)) * 1000).astype("<i2")
    meta, _ = meta_and_chunks(arr, (1, 7, 9), "C")
    raw = _raw_copy(tmp_path, meta, arr, statistics=[])
    assert images.pam(meta) == images.pam(meta, [])
    _gdal("gdalinfo", "-stats", str(raw))
    written = raw.with_name("a.raw.aux.xml").read_bytes()
    assert b'domain="ENVI"' in written
    stats = images.pam_statistics(written, meta)
    assert stats is not None and len(stats) == 2
    for band, st in zip(arr.astype("f8"), stats):
        for key, want in (
            ("MINIMUM", band.min()),
            ("MAXIMUM", band.max()),
            ("MEAN", band.mean()),
            ("STDDEV", band.std()),
        ):
            assert float(st["STATISTICS_" + key]) == pytest.approx(want, rel=1e-6)
    other = tmp_path / "again"
    other.mkdir()
    raw = _raw_copy(other, meta, arr, statistics=stats)
    before = raw.with_name("a.raw.aux.xml").read_bytes()
    r = _gdal("gdalinfo", "-stats", str(raw))
    assert raw.with_name("a.raw.aux.xml").read_bytes() == before and "ERROR" not in r.stderr
    assert r.stdout.count("STATISTICS_MEAN=") == 2


def test_pam_statistics_refuse_other_metadata(tmp_path):
    arr = np.arange(30, dtype="<u2").reshape(6, 5)
    meta, _ = meta_and_chunks(arr, (6, 5), "C")
    raw = _raw_copy(tmp_path, meta, arr, statistics=[])
    _gdal("gdal_edit.py", "-mo", "KEY=VALUE", str(raw))
    written = raw.with_name("a.raw.aux.xml").read_bytes()
    assert b"KEY" in written
    assert images.pam_statistics(written, meta) is None
    assert images.pam_statistics(written.replace(b"PAMDataset", b"Other"), meta) is None
    assert images.pam_statistics(b"<PAMDataset>\n</PAMDataset>\n", meta) == [{}]
    bad_band = b'<PAMDataset><PAMRasterBand band="2"><Metadata/></PAMRasterBand></PAMDataset>'
    assert images.pam_statistics(bad_band, meta) is None


@pytest.mark.parametrize("band", ["\u00b2", "1" * 5000, "01x", ""])
def test_pam_statistics_refuse_band_numbers_that_are_no_numbers(band):
    """A rewrite naming a band by superscript digits, or by more digits than int() converts,
    is refused like any other change (it never raises)."""
    meta, _ = meta_and_chunks(np.arange(30, dtype="<u2").reshape(6, 5), (6, 5), "C")
    written = f'<PAMDataset><PAMRasterBand band="{band}"></PAMRasterBand></PAMDataset>'.encode()
    assert images.pam_statistics(written, meta) is None
