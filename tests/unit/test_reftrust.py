"""What a reference set may read: the defaults of local and remote reference files, the option's prefixes, and URLs that try to escape them."""

from __future__ import annotations

import logging

import pytest

from zarrfs.errors import StoreError, UserError
from zarrfs.storage.reftrust import Trust

REMOTE_REFS = "https://example.org/refs/refs.json"


@pytest.fixture
def tree(tmp_path):
    """(allowed directory, a secret outside it, a link inside it to the secret)."""
    allowed = tmp_path / "nc"
    allowed.mkdir()
    (allowed / "a.nc").write_bytes(b"data")
    (tmp_path / "nc2").mkdir()
    secret = tmp_path / "secret" / "id_rsa"
    secret.parent.mkdir()
    secret.write_bytes(b"secret")
    (allowed / "link.nc").symlink_to(secret)
    return allowed, secret


def _refused(trust, url):
    with pytest.raises(StoreError) as e:
        trust.target(url, "a/0")
    return str(e.value)


@pytest.mark.parametrize("reference", [None, "/home/u/refs.json", "file:///home/u/refs.json"])
def test_a_local_reference_file_names_local_files_and_remote_urls(tree, reference):
    trust = Trust(reference, (), None)
    _allowed, secret = tree
    for url in (str(secret), f"file://{secret}", "s3://bucket/x.nc", "https://example.org/x.nc", "memory:///x"):
        assert trust.target(url, "a/0").url.endswith(url.split("://")[-1])


@pytest.mark.parametrize("reference", [REMOTE_REFS, "s3://bucket/refs.json", "gs://bucket/refs.parq"])
def test_a_remote_reference_file_names_remote_urls_only(tree, reference, caplog):
    trust = Trust(reference, (), None)
    allowed, secret = tree
    assert trust.target("s3://bucket/x.nc", "a/0").protocol == "s3"
    assert trust.target("https://data.example.org/x.nc", "a/0").protocol == "https"
    assert trust.target("gs://bucket/x.nc", "a/0").protocol == "gs"
    caplog.set_level(logging.WARNING)
    for url in (str(secret), f"file://{secret}", f"local://{secret}", f"{allowed}/../secret/id_rsa"):
        said = _refused(trust, url)
        assert f"authorize_virtual_chunk_access=file://{secret.parent}/" in said, said
    # One line for the prefix, however many reads it refuses.
    lines = [r.getMessage() for r in caplog.records if "are not read" in r.getMessage()]
    assert len(lines) == 1 and f"file://{secret.parent}/" in lines[0]
    for url, prefix in (
        ("sftp://localhost/etc/shadow", "sftp://localhost/"),
        ("http://169.254.169.254/latest/meta-data/", "http://169.254.169.254/"),
        ("http://localhost:8080/x", "http://localhost:8080/"),
        ("http://[::1]/x", "http://[::1]/"),
        ("http://127.1:8080/x", "http://127.1:8080/"),
        ("http://evil.example@2130706433/x", "http://evil.example@2130706433/"),
        ("memory:///x", "memory:///"),
    ):
        assert f"authorize_virtual_chunk_access={prefix}" in _refused(trust, url), url


def test_a_reference_file_this_machine_serves_may_name_what_else_it_serves():
    """Loopback and link-local hosts are this machine's: refused from a reference file elsewhere only."""
    here = Trust("http://127.0.0.1:8000/refs.json", (), None)
    assert here.target("http://127.0.0.1:9000/t.nc", "a/0").url == "http://127.0.0.1:9000/t.nc"
    on_moto = Trust("s3://bucket/refs.json", (), None, reference_host="127.0.0.1")
    assert on_moto.target("http://localhost:9000/t.nc", "a/0").protocol == "http"
    for elsewhere in (Trust("s3://bucket/refs.json", (), None), Trust(REMOTE_REFS, (), None)):
        _refused(elsewhere, "http://127.0.0.1:9000/t.nc")
        _refused(elsewhere, "http://169.254.169.254/latest/meta-data/")


def test_authorized_prefixes_admit_what_lies_below_them_and_nothing_else(tree):
    allowed, secret = tree
    trust = Trust(REMOTE_REFS, (f"file://{allowed}/", "http://localhost:8080/data/"), None)
    assert trust.target(str(allowed / "a.nc"), "a/0").url == str(allowed / "a.nc")
    assert trust.target(f"file://{allowed}/a.nc", "a/0").url == str(allowed / "a.nc")
    assert trust.target("http://localhost:8080/data/x.nc", "a/0").protocol == "http"
    for url in (
        str(allowed / "link.nc"),  # a link out of it
        f"{allowed}/../secret/id_rsa",
        str(allowed.parent / "nc2" / "a.nc"),  # beside it, with a name it starts
        str(secret),
        "http://localhost:8080/data/../admin",
        "http://localhost:8080/data/%2e%2e/admin",
        "http://localhost:8080/database",
    ):
        _refused(trust, url)


def test_a_prefix_without_trailing_slash_is_a_directory(tree):
    allowed, _ = tree
    trust = Trust(REMOTE_REFS, (f"file://{allowed}",), None)
    assert trust.target(str(allowed / "a.nc"), "a/0")
    _refused(trust, str(allowed.parent / "nc2" / "a.nc"))


def test_relative_and_home_paths_never_resolve(tree):
    for reference in (None, REMOTE_REFS):
        trust = Trust(reference, ("file:///",), None)
        for url in ("id_rsa", "~/.ssh/id_rsa", "file://~/.ssh/id_rsa", "file://localhost/etc/passwd"):
            assert "a relative path" in _refused(trust, url), url


def test_targets_without_protocol_take_remote_protocol():
    trust = Trust(REMOTE_REFS, (), "s3")
    target = trust.target("bucket/x.nc", "a/0")
    assert (target.protocol, target.url) == ("s3", "s3://bucket/x.nc")


@pytest.mark.parametrize("prefix", ["file://~/.ssh/", "file://data/nc/", "local://x/"])
def test_a_local_prefix_must_be_absolute(prefix):
    with pytest.raises(UserError, match="a local prefix is an absolute path"):
        Trust(REMOTE_REFS, (prefix,), None)
