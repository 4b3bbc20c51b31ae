"""``python -m http.server`` as a remote store for the tests, on a free port of 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

from support.s3 import free_port

# ``python -m http.server`` as it is: one thread a connection, HTTP/1.0 (each answer closes its
# connection), a listen backlog of 5.
HTTP_SERVER_MAIN = (
    "import runpy, sys; sys.argv = ['http.server'] + sys.argv[1:]; "
    "runpy.run_module('http.server', run_name='__main__', alter_sys=True)"
)


class HttpServer:
    """``python -m http.server`` over DIRECTORY on a free port of 127.0.0.1, logging to LOG_PATH."""

    def __init__(self, directory, log_path):
        self.directory = directory
        self.log_path = log_path
        self.proc = None
        self.port = None

    def start(self) -> None:
        for _attempt in range(3):
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        HTTP_SERVER_MAIN,
                        "--bind",
                        "127.0.0.1",
                        str(self.port),
                        "--directory",
                        str(self.directory),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(self.url(""), timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError(f"http.server did not start; see {self.log_path}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
