"""moto's S3 server on loopback for the remote tests: its bucket, credentials and start-up."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import s3fs

BUCKET = "zarrfs-test"
CREDENTIALS = {"key": "testing", "secret": "testing"}


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at this moment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[tuple[str, s3fs.S3FileSystem]]:
    """A moto S3 server on 127.0.0.1 with one bucket, logging to LOG; yields (endpoint URL, s3fs file system)."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"moto server did not start; see {log}") from None
                time.sleep(0.1)
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True, **CREDENTIALS)
        fs.mkdir(BUCKET)
        yield endpoint, fs
    finally:
        proc.terminate()
        proc.wait(10)
