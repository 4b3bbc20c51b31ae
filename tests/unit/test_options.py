"""Options: -o strings and --flags into one validated value."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zarrfs.errors import UserError
from zarrfs.manual import OPTION_TABLE, options_markdown
from zarrfs.options import (
    build_options,
    parse_size,
    read_storage_options_file,
    redact_url,
    secrets_in,
    split_o,
)

from support import REPO


@pytest.mark.parametrize(
    "text,expected",
    [("512M", 512 << 20), ("2G", 2 << 30), ("1048576", 1 << 20), ("1.5GiB", int(1.5 * (1 << 30))), ("64k", 64 << 10)],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["abc", "", "12X", "-1M"])
def test_bad_sizes(bad):
    with pytest.raises(UserError):
        parse_size(bad)


def test_split_keeps_json_commas():
    assert split_o('cache_size=1G,storage_options={"anon": true, "a": [1,2]},show_views') == [
        "cache_size=1G",
        'storage_options={"anon": true, "a": [1,2]}',
        "show_views",
    ]


def test_all_options():
    o = build_options(
        [
            "writable",
            "cache_size=2G",
            "format=v3-draft",
            'storage_options={"anon":true}',
            "show_views",
            "chunks=10,20",
            "codec=zstd:3",
            "log_level=DEBUG",
            "log_file=/tmp/x",
            "allow_other",
            "uid=1000",
            "gid=100",
            "umask=022",
            "rw",
            "nosuid",
            "_netdev",
        ]
    )
    assert o.writable and o.show_views
    assert o.cache_size_bytes == 2 << 30 and o.format == "v3-draft"
    assert o.storage_options == {"anon": True} and o.chunks == (10, 20) and o.codec == "zstd:3"
    assert o.log_level == "debug" and o.log_file == "/tmp/x"
    assert o.fuse_options == ("allow_other", "uid=1000", "gid=100", "umask=022")


def test_defaults():
    o = build_options([])
    assert not o.writable and o.cache_size_bytes == 512 << 20 and o.format == "auto"


@pytest.mark.parametrize(
    "bad",
    [
        "nosuch",
        "format=v9",
        "cache_size=abc",
        "chunks=0",
        "chunks=a",
        "storage_options=[1]",
        "storage_options={bad",
        "log_level=loud",
        "codec=",
        "uid=me",
        "umask=999",
        "writable=maybe",
        "upload_part_size=4M",
    ],
)
def test_bad_options(bad):
    with pytest.raises(UserError):
        build_options([bad])


def test_chunks_in_a_comma_list():
    o = build_options(split_o("writable,chunks=8,5,codec=zstd:3"))
    assert o.chunks == (8, 5) and o.codec == "zstd:3" and o.writable


# --------------------------------------------------------------------------- the one option table

CONFIGURATION = REPO / "docs" / "CONFIGURATION.md"
EXAMPLES = {
    "cache_size": "64M",
    "format": "v3",
    "v1_order": "writer",
    "storage_options": "{}",
    "chunks": "4,4",
    "codec": "zstd:3",
    "log_level": "info",
    "log_file": "/tmp/x.log",
    "storage_options_file": "/x.json",
    "fsname": "data",
    "uid": "1",
    "gid": "2",
    "umask": "022",
    "subtype": "zarr",
    "timeout": "5",
    "upload_part_size": "8M",
    "metadata_ttl": "0",
    "remote_protocol": "s3",
    "remote_options": '{"anon": true}',
    "cache_dir": "/tmp/zc",
    "disk_cache_size": "1G",
    "ref": "v1",
    "snapshot": "1CECHNKREP0F1RSTCMT0",
    "authorize_virtual_chunk_access": "file:///data/nc/",
}


def test_configuration_option_table_is_generated():
    """docs/CONFIGURATION.md holds the table options.py makes; ZARRFS_WRITE_DOCS=1 rewrites it."""
    text = CONFIGURATION.read_text()
    block = re.compile(r"(<!-- options:begin -->\n)(.*?)(<!-- options:end -->)", re.S)
    m = block.search(text)
    assert m, "docs/CONFIGURATION.md has no <!-- options:begin --> ... <!-- options:end --> block"
    if m.group(2) != options_markdown() and os.environ.get("ZARRFS_WRITE_DOCS") == "1":
        CONFIGURATION.write_text(text[: m.start(2)] + options_markdown() + text[m.end(2) :])
        return
    assert m.group(2) == options_markdown(), (
        "docs/CONFIGURATION.md's option table differs from OPTION_TABLE: run "
        "ZARRFS_WRITE_DOCS=1 pytest tests/unit/test_options.py -k configuration"
    )


def test_every_table_option_is_accepted():
    for o in OPTION_TABLE:
        item = o.name if "=" not in o.spelling else f"{o.name}={EXAMPLES[o.name]}"
        build_options([item])


def test_help_lists_every_option_with_its_default():
    r = subprocess.run([sys.executable, "-m", "zarrfs", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for o in OPTION_TABLE:
        assert f"\n  {o.spelling}\n" in r.stdout, o.spelling
    assert len(re.findall(r"\(default:\s", r.stdout)) == len(OPTION_TABLE)
    for name in ("v1_order", "auto_unmount", "fsname", "storage_options_file"):
        assert name in r.stdout


def test_man_page_lists_every_option():
    r = subprocess.run([sys.executable, "-m", "zarrfs", "--man"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(".TH ZARRFS 1")
    text = subprocess.run(
        ["groff", "-man", "-Tutf8", "-P-cbou"], input=r.stdout, capture_output=True, text=True, timeout=60
    ).stdout
    for o in OPTION_TABLE:
        assert o.spelling in text, o.spelling


def _doc_headings(path: Path) -> set[str]:
    """The headings of a Markdown file as the help texts cite them: without backticks."""
    in_code, out = False, set()
    for line in path.read_text().splitlines():
        in_code ^= line.startswith("```")
        if not in_code and (m := re.match(r"#+ (.*)", line)):
            out.add(m.group(1).replace("`", "").strip())
    return out


def test_help_and_man_show_the_tree_and_cite_docs_that_exist():
    help_text = subprocess.run(
        [sys.executable, "-m", "zarrfs", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    man = subprocess.run([sys.executable, "-m", "zarrfs", "--man"], capture_output=True, text=True, timeout=60).stdout
    man = re.sub(r"\\f[BRI]", "", man).replace("\\-", "-").replace("\\&", "")
    for name, text in (("--help", help_text), ("zarrfs.1", man)):
        for view in (
            "npy-f/PATH.npy",
            "raw/PATH.raw",
            "raw/PATH.hdr",
            "gdal/PATH.vrt",
            "tiff/PATH.tif",
            "preview/PATH.png",
            "netcdf/PATH.nc",
            "ome-tiff/IMAGE.ome.tif",
            "stats.json",
        ):
            assert view in text, f"{name} does not show {view} in its tree"
        assert "README" not in text, f"{name} cites the README, whose sections moved to docs/"
        cited = re.findall(r"\(docs/([A-Z]+\.md): ([^()]+)\)", re.sub(r"\s+", " ", text))
        assert {file for file, _ in cited} >= {"SEMANTICS.md", "CONFIGURATION.md", "REMOTE.md", "VIEWS.md"}, name
        missing = [
            f"docs/{file}: {heading}"
            for file, heading in cited
            if not (REPO / "docs" / file).is_file() or heading not in _doc_headings(REPO / "docs" / file)
        ]
        assert missing == [], f"{name} cites documentation that does not exist"


def test_remote_options_of_references():
    o = build_options(split_o('remote_protocol=s3,remote_options={"anon": true, "client_kwargs": {"a": 1}}'))
    assert o.remote_protocol == "s3" and o.remote_options == {"anon": True, "client_kwargs": {"a": 1}}
    assert build_options([]).remote_options is None
    for bad, says in (
        ("remote_options=[1]", "must be a JSON object"),
        ("remote_options={x", "not valid JSON"),
        ("remote_protocol=s3://b", "expected a protocol name"),
    ):
        with pytest.raises(UserError, match=says):
            build_options([bad])


def test_fstab_only_options_are_ignored():
    o = build_options(split_o("x-systemd.automount,x-systemd.idle-timeout=60,comment=x,_netdev,nofail,allow_other"))
    assert o.fuse_options == ("allow_other",)


def test_redact_url():
    assert redact_url("https://user:pw@host:8080/a.zarr?token=abc&x=1") == "https://host:8080/a.zarr?token=***&x=1"
    assert redact_url("simplecache::s3://AKIA:sec@bucket/run.zarr") == "simplecache::s3://bucket/run.zarr"
    assert redact_url("/data/run.zarr") == "/data/run.zarr"


def test_secrets_in():
    found = secrets_in(
        {
            "key": "AKIA1234",
            "secret": "s3cr3t!",
            "client_kwargs": {"endpoint_url": "http://x"},
            "headers": {"Authorization": "Bearer tok-123"},
        },
        "https://u:pass@h/",
    )
    assert {"AKIA1234", "s3cr3t!", "Bearer tok-123", "tok-123", "pass"} <= found
    assert "http://x" not in found and "Bearer" not in found


def test_storage_options_file(tmp_path):
    p = tmp_path / "so.json"
    p.write_text('{"anon": true}')
    p.chmod(0o600)
    assert read_storage_options_file(str(p)) == {"anon": True}
    for mode in (0o640, 0o604, 0o620):
        p.chmod(mode)
        with pytest.raises(UserError, match="chmod 600"):
            read_storage_options_file(str(p))
    p.chmod(0o600)
    p.write_text("[1]")
    with pytest.raises(UserError, match="JSON object"):
        read_storage_options_file(str(p))
    with pytest.raises(UserError, match="No such file"):
        read_storage_options_file(str(tmp_path / "none.json"))


def test_timeout_and_metadata_ttl():
    o = build_options(["timeout=2.5", "metadata_ttl=inf"])
    assert o.timeout_s == 2.5 and o.metadata_ttl_s == float("inf")
    assert build_options([]).timeout_s == 30 and build_options([]).metadata_ttl_s is None
    for bad in ("timeout=0", "timeout=-1", "timeout=inf", "timeout=x", "metadata_ttl=-1", "metadata_ttl=nan"):
        with pytest.raises(UserError):
            build_options([bad])


def test_authorized_virtual_chunk_containers_are_url_prefixes():
    o = build_options(split_o("authorize_virtual_chunk_access=file:///data/nc/,s3://b/nc/,show_views"))
    assert o.authorize_virtual_chunk_access == ("file:///data/nc/", "s3://b/nc/") and o.show_views
    with pytest.raises(UserError, match="URL prefixes"):
        build_options(["authorize_virtual_chunk_access=/data/nc"])
