"""Credentials and start-up errors against moto's S3 server: secrets never in a log line, at any level,
nor in mount's source; a missing bucket and missing credentials are named as such."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np

from support import builders, mounting, oracles
from support.s3 import BUCKET

# Distinctive credentials: moto accepts any, and a grep finds these anywhere they leak.
ACCESS_KEY = "AKIAZARRFSLEAKCHECK1"
SECRET_KEY = "zarrfs-secret-Xq7pL2vN9dR4tY6u"


def _put_store(fs, tmp_path: Path, name: str) -> None:
    import zarr

    local = tmp_path / name
    zarr.open_group(os.fspath(local), mode="w", zarr_format=3)
    builders.create_array(
        local, builders.ArraySpec("a", "int16", (40, 30), (16, 16), "zstd"), 3, np.random.default_rng(4)
    )
    fs.put(os.fspath(local), f"{BUCKET}/{name}", recursive=True)


def _secret_file(tmp_path: Path, endpoint: str) -> Path:
    path = tmp_path / "s3.json"
    path.write_text(json.dumps({"key": ACCESS_KEY, "secret": SECRET_KEY, "client_kwargs": {"endpoint_url": endpoint}}))
    path.chmod(0o600)
    return path


def test_secrets_never_logged(s3, mount, tmp_path):
    endpoint, fs = s3
    _put_store(fs, tmp_path, "secret.zarr")
    so = _secret_file(tmp_path, endpoint)
    mnt = mount(f"s3://{BUCKET}/secret.zarr", "log_level=debug", f"storage_options_file={so}")
    assert (mnt / "a.npy").read_bytes() == oracles.expected_for(tmp_path / "secret.zarr", "a").npy
    pid = mounting.pids_serving(mnt)[0]
    for secret in (ACCESS_KEY, SECRET_KEY):
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert not (mnt / "nosuch").exists()
    os.kill(pid, signal.SIGUSR1)  # back to the configured level and forth: lines of both
    os.kill(pid, signal.SIGUSR1)
    mounting.unmount_and_wait(mount, mnt)
    # a failing mount with the same credentials: its error goes to stderr and the log
    bad_mnt = tmp_path / "bad-mnt"
    bad_mnt.mkdir()
    bad_log = tmp_path / "bad.log"
    source = f"s3://{BUCKET}-missing/x.zarr"
    cmd = [
        *mounting.ZARRFS,
        source,
        os.fspath(bad_mnt),
        "-o",
        f"log_level=debug,log_file={bad_log},storage_options_file={so}",
    ]
    code, out, err, _ = mounting.run_expecting_failure(cmd, bad_mnt, tmp_path)
    assert code == 1, err
    text = mount.log_text(mnt) + bad_log.read_text() + out + err
    assert " DEBUG " in text, "the test needs debug lines to look through"
    for secret in (ACCESS_KEY, SECRET_KEY):
        assert secret not in text, f"{secret} leaked:\n" + "\n".join(ln for ln in text.splitlines() if secret in ln)


def test_missing_bucket_is_named(s3, tmp_path):
    endpoint, _ = s3
    so = _secret_file(tmp_path, endpoint)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = [*mounting.ZARRFS, f"s3://{BUCKET}-nosuch/run.zarr", os.fspath(mnt), "-o", f"storage_options_file={so}"]
    code, _, err, was_mounted = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert not was_mounted and code == 1
    assert err.splitlines() == [f"zarrfs: s3://{BUCKET}-nosuch/run.zarr: bucket '{BUCKET}-nosuch' does not exist"], err


def test_missing_path_in_a_bucket_is_named(s3, tmp_path):
    endpoint, _ = s3
    so = _secret_file(tmp_path, endpoint)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = [*mounting.ZARRFS, f"s3://{BUCKET}/no/such.zarr", os.fspath(mnt), "-o", f"storage_options_file={so}"]
    code, _, err, _ = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert code == 1
    assert err.splitlines() == [f"zarrfs: s3://{BUCKET}/no/such.zarr: no such file, directory or store"], err


def test_missing_credentials_are_named(s3, tmp_path):
    """No key in the options, none in the environment, no ~/.aws, no instance metadata: said so."""
    endpoint, _ = s3
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        HOME=os.fspath(tmp_path),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.fspath(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=os.fspath(tmp_path / "none"),
    )
    so = json.dumps({"client_kwargs": {"endpoint_url": endpoint}})
    r = subprocess.run(
        [*mounting.ZARRFS, f"s3://{BUCKET}/x.zarr", os.fspath(mnt), "-o", f"storage_options={so}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    mounting.unmount(mnt)
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and "no credentials found" in r.stderr, r.stderr
