"""The shard index (one reader and encoder for v3 sharding and the drafts' transformer) and sharding_indexed."""

import numpy as np
import pytest

from zarrfs.codecs.chain import BytesLayout, CodecChain
from zarrfs.codecs.sharding import ABSENT, PLAIN_INDEX, ShardIndex, ShardingIndexed
from zarrfs.errors import CorruptChunk
from zarrfs.formats.v3 import v3_chain

CRC_INDEX = ShardIndex(
    v3_chain([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}], 3, "test"), at_end=False
)


def test_plain_index_is_uint64_pairs_at_the_end():
    shard = PLAIN_INDEX.assemble({(1,): b"one", (0,): b"zero"}, (3,))
    index = np.frombuffer(shard[-48:], "<u8").reshape(3, 2)
    assert shard[:7] == b"zeroone"  # C order over the inner grid, whatever order they came in
    assert index.tolist() == [[0, 4], [4, 3], [ABSENT, ABSENT]]
    assert PLAIN_INDEX.nbytes((3,)) == 48
    assert {p: None if b is None else bytes(b) for p, b in PLAIN_INDEX.inner_chunks(shard, (3,), "k").items()} == {
        (0,): b"zero",
        (1,): b"one",
        (2,): None,
    }


def test_index_at_the_start_with_a_checksum_round_trips():
    parts = {(0, 1): b"ab", (1, 0): b"cde"}
    shard = CRC_INDEX.assemble(parts, (2, 2))
    assert CRC_INDEX.nbytes((2, 2)) == 16 * 4 + 4
    got = CRC_INDEX.inner_chunks(shard, (2, 2), "k")
    assert {p: None if b is None else bytes(b) for p, b in got.items()} == {
        (0, 0): None,
        (0, 1): b"ab",
        (1, 0): b"cde",
        (1, 1): None,
    }
    broken = bytearray(shard)
    broken[3] ^= 1  # the checksum no longer matches
    with pytest.raises(CorruptChunk, match="index"):
        CRC_INDEX.inner_chunks(bytes(broken), (2, 2), "k")


def test_no_inner_chunk_is_an_empty_shard():
    assert PLAIN_INDEX.assemble({(0,): None, (1,): b""}, (2,)) == b""


@pytest.mark.parametrize("entry,match", [((0, ABSENT), "absent in one field only"), ((0, 99), "outside the shard")])
def test_bad_entries_refused(entry, match):
    index = np.array([entry], "<u8")
    with pytest.raises(CorruptChunk, match=match):
        PLAIN_INDEX.inner_chunks(b"abc" + index.tobytes(), (1,), "k")


def test_short_shard_refused():
    with pytest.raises(CorruptChunk, match="shorter than its index"):
        PLAIN_INDEX.inner_chunks(b"\0" * 10, (1,), "k")


def test_sharding_indexed_encodes_changed_inner_chunks_only():
    inner = CodecChain((), BytesLayout("little", "C"), ())
    codec = ShardingIndexed((2,), inner, PLAIN_INDEX.codec, True)
    fill = np.zeros((), "<u2")
    arr = np.arange(6, dtype="<u2")
    old = codec.encode(arr, fill)
    assert np.array_equal(codec.decode(old, (6,), arr.dtype, fill), arr)
    changed = arr.copy()
    changed[0:4] = 7  # inner chunks 0 and 1 change; only 1 is said to have changed
    new = codec.encode_changed(changed, fill, old, {(1,)})
    assert codec.decode(new, (6,), arr.dtype, fill).tolist() == [0, 1, 7, 7, 4, 5]
    assert codec.encode_changed(changed, fill, b"junk", {(1,)}) == codec.encode(changed, fill)
