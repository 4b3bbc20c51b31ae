"""Selections (zarrfs.views.slices): parsing against numpy's own indexing, and byte layouts against np.save."""

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrfs.views.slices import BadSelection, SliceStream, selection, split_name

from support.core import LAYOUT_DTYPES, meta_and_chunks


def index_text(draw, ndim: int) -> str:
    """A basic-indexing selection as text, in range or not (numpy decides)."""
    items = []
    n_items = draw(st.integers(0, ndim + 1))
    ellipsis_at = draw(st.one_of(st.none(), st.integers(0, n_items)))
    opt = st.one_of(st.none(), st.integers(-12, 12))
    for i in range(n_items):
        if i == ellipsis_at:
            items.append("...")
        if draw(st.booleans()):
            items.append(str(draw(st.integers(-11, 11))))
        else:
            lo, hi = draw(opt), draw(opt)
            step = draw(st.one_of(st.none(), st.integers(-4, 4).filter(bool)))
            text = f"{'' if lo is None else lo}:{'' if hi is None else hi}"
            items.append(text + ("" if step is None else f":{step}"))
    return ",".join(items)


@st.composite
def cases(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    chunks = tuple(draw(st.integers(1, 5)) for _ in shape)
    d = draw(st.sampled_from(LAYOUT_DTYPES))
    dtype = np.dtype([tuple(f) for f in d] if isinstance(d, list) else d)
    raw = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(
        0, 256, int(np.prod(shape, dtype=int)) * dtype.itemsize, dtype=np.uint8
    )
    return raw.view(dtype).reshape(shape), chunks, draw(st.sampled_from("CF")), index_text(draw, ndim)


@settings(max_examples=400, deadline=None)
@given(cases(), st.data())
def test_slice_matches_numpy(case, data):
    arr, chunks, chunk_order, text = case
    try:
        expected = arr[eval(f"np.s_[{text}]")] if text else arr[()]  # the oracle: numpy itself
    except IndexError:
        with pytest.raises(BadSelection):
            selection(text, arr.shape)
        return
    meta, chunk_arrays = meta_and_chunks(arr, chunks, chunk_order)
    for with_header in (True, False):
        stream = SliceStream(meta, *selection(text, arr.shape)[:1], with_header, selection(text, arr.shape)[1])
        buf = io.BytesIO()
        np.save(buf, np.asarray(expected))
        want = buf.getvalue() if with_header else np.ascontiguousarray(expected).tobytes()
        assert stream.size == len(want)
        for _ in range(3):
            off = data.draw(st.integers(0, stream.size + 2))
            n = data.draw(st.integers(0, stream.size + 3))
            plan = stream.plan(off, n)
            got = stream.assemble(plan, {i: chunk_arrays[i] for i in plan.chunks})
            assert bytes(got) == want[off : off + n]


def test_plan_loads_only_chunks_the_selection_needs():
    arr = np.arange(100 * 100, dtype="<i4").reshape(100, 100)
    meta, _ = meta_and_chunks(arr, (10, 10), "C")
    stream = SliceStream(meta, selection("5, 20:40:7", arr.shape)[0])
    assert set(stream.plan(0, stream.size).chunks) == {(0, 2), (0, 3)}
    stream = SliceStream(meta, selection("::-50, -1", arr.shape)[0])
    assert set(stream.plan(0, stream.size).chunks) == {(9, 9), (4, 9)}


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "a",
        "1.5",
        "True",
        "[1,2]",
        "None",
        "1:2:0",
        "...,...",
        "1,2",
        "x[1]",
        "1;2",
        "",
        "(1)(2)",
        "3",
        "-4",
    ],
)
def test_bad_selections_are_refused(text):
    with pytest.raises(BadSelection):
        selection(text or "1,2,3", (3,))


def test_names():
    assert split_name("t[0:90,::2].npy") == ("t", "0:90,::2", True)
    assert split_name("t[-1].raw") == ("t", "-1", False)
    assert split_name("t.npy") is None and split_name("[1].npy") is None
