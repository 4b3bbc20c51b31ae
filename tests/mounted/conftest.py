"""Fixtures of the remote mounted tests: moto's S3 server, and the latency proxy in front of it."""

from __future__ import annotations

import urllib.parse

import pytest

from benchmarks.latency_proxy import Proxy
from support.s3 import moto_server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 with one bucket; yields (endpoint URL, s3fs file system)."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def proxy(s3):
    """benchmarks/latency_proxy.py in front of the S3 server (its port is where clients connect)."""
    endpoint, _ = s3
    p = Proxy(urllib.parse.urlparse(endpoint).port).start()
    yield p
    p.stop()
