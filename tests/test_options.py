"""Options: -o strings and --flags into one validated value."""

import pytest

from zarrfs.errors import UserError
from zarrfs.options import build_options, parse_size, split_o


@pytest.mark.parametrize("text,expected", [("512M", 512 << 20), ("2G", 2 << 30), ("1048576", 1 << 20),
                                           ("1.5GiB", int(1.5 * (1 << 30))), ("64k", 64 << 10)])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["abc", "", "12X", "-1M"])
def test_bad_sizes(bad):
    with pytest.raises(UserError):
        parse_size(bad)


def test_split_keeps_json_commas():
    assert split_o('cache_size=1G,storage_options={"anon": true, "a": [1,2]},show_views') == [
        "cache_size=1G", 'storage_options={"anon": true, "a": [1,2]}', "show_views"]


def test_all_options():
    o = build_options(["writable", "cache_size=2G", "format=v3-draft", 'storage_options={"anon":true}',
                       "show_views", "chunks=10,20", "codec=zstd:3", "log_level=DEBUG", "log_file=/tmp/x",
                       "allow_other", "uid=1000", "gid=100", "umask=022", "rw", "nosuid", "_netdev"])
    assert o.writable and o.show_views
    assert o.cache_size_bytes == 2 << 30 and o.format == "v3-draft"
    assert o.storage_options == {"anon": True} and o.chunks == (10, 20) and o.codec == "zstd:3"
    assert o.log_level == "debug" and o.log_file == "/tmp/x"
    assert o.fuse_options == ("allow_other", "uid=1000", "gid=100", "umask=022")


def test_defaults():
    o = build_options([])
    assert not o.writable and o.cache_size_bytes == 512 << 20 and o.format == "auto"


@pytest.mark.parametrize("bad", ["nosuch", "format=v9", "cache_size=abc", "chunks=0", "chunks=a",
                                 "storage_options=[1]", "storage_options={bad", "log_level=loud",
                                 "codec=", "uid=me", "umask=999", "writable=maybe"])
def test_bad_options(bad):
    with pytest.raises(UserError):
        build_options([bad])


def test_chunks_in_a_comma_list():
    o = build_options(split_o("writable,chunks=8,5,codec=zstd:3"))
    assert o.chunks == (8, 5) and o.codec == "zstd:3" and o.writable
