"""A fault-injecting TCP proxy for HTTP stores: adds latency, stops answering, refuses; counts requests.

Used by benchmarks/bench_remote.py and the mounted remote tests (imported by path; never by the
package). It keeps the request line of every request, the bytes sent back, and the most
connections open at once. Modes, switched while running:
  pass    forward both ways, each client->server piece delivered `latency_s` after it arrived
  silent  accept and read, forward nothing either way (a store that stopped answering)
  refuse  close the listening socket: new connections are refused; open ones are cut
  deny    answer every request with S3's 403 AccessDenied (open connections are cut first)

    python benchmarks/latency_proxy.py --target 127.0.0.1:5000 --latency 0.02 [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import threading
import time

# The first bytes of an HTTP/1.1 request: what a request line looks like at a message's start.
REQUEST_LINE = re.compile(rb"(GET|HEAD|PUT|POST|DELETE|PATCH|OPTIONS) (\S+) HTTP/1\.[01]\r\n")
# A single byte range in a request's headers: `bytes=A-B` or the suffix `bytes=-N`.
RANGE_HEADER = re.compile(rb"\r\nrange: *bytes=(\d*)-(\d*)\r\n", re.IGNORECASE)
EXPECT_HEADER = re.compile(rb"\r\nexpect: *100-continue\r\n", re.IGNORECASE)
READ_BYTES = 1 << 16


class Proxy:
    """One proxy on 127.0.0.1 in its own thread and event loop; `port` is where clients connect."""

    def __init__(self, target_port: int, latency_s: float = 0.0, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.latency_s = latency_s
        self.mode = "pass"
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request seen
        # (method, path) of the requests that waited for the server's `100 Continue` before their body
        self.expect_continue: list[tuple[str, str]] = []
        # (path, bytes asked for) of every ranged GET: what the client asked, whenever the answer comes.
        self.ranges: list[tuple[str, int]] = []
        self.open_now = 0  # client connections open now, and the most at once since reset_counts
        self.open_peak = 0
        self.bytes_down = 0  # bytes the store sent back (headers included), since reset_counts
        # With `timeline` on: (connection, perf_counter seconds, path or None, bytes) per request
        # (bytes 0, when its request line arrived) and per piece of answer (path None).
        self.timeline: list[tuple[int, float, str | None, int]] | None = None
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)

    def start(self) -> Proxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def _call(self, coro) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()

    def set_mode(self, mode: str) -> None:
        """pass, silent, refuse or deny (see the module's docstring); back to pass listens again on the same port."""
        assert mode in ("pass", "silent", "refuse", "deny")
        was, self.mode = self.mode, mode
        if mode in ("refuse", "deny") or was == "deny":  # no connection keeps its old answers
            self._call(self._close())
        if mode != "refuse" and self._server is None:
            self._call(self._listen())

    def count(self, method: str | None = None) -> int:
        return sum(1 for m, _ in self.requests if method is None or m == method)

    def reset_counts(self) -> None:
        self.requests.clear()
        self.expect_continue.clear()
        self.ranges.clear()
        self.bytes_down = 0
        self.open_peak = self.open_now

    def stop(self) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_now += 1
        self.open_peak = max(self.open_peak, self.open_now)
        counted = [True]  # until the store's end of this connection (or the client's) closes it
        try:
            await self._serve_one(reader, writer, counted)
        finally:
            if counted[0]:
                self.open_now -= 1

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counted: list[bool]) -> None:
        self._writers.add(writer)
        if self.mode == "deny":
            await self._deny(reader, writer)
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_w)
        try:
            await asyncio.gather(
                self._pump(reader, up_w, True, id(writer)), self._pump(up_r, writer, False, id(writer), counted)
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, up_w):
                self._writers.discard(w)
                w.transport.abort()

    async def _deny(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer each request on this connection as S3 does when the credentials may not do it."""
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            b"<Message>Access Denied</Message><RequestId>0</RequestId></Error>"
        )
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                m = REQUEST_LINE.match(head)
                if m:
                    self.requests.append((m.group(1).decode(), m.group(2).decode()))
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                if length:
                    await reader.readexactly(int(length.group(1)))
                writer.write(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        upstream: bool,
        conn: int,
        counted: list[bool] | None = None,
    ) -> None:
        # Upstream bytes go on `latency_s` after they arrived, each piece on its own clock: a
        # delay, not a cap on bandwidth (a body of N pieces arrives one latency late, not N).
        late: asyncio.Queue[tuple[float, bytes] | None] | None = None
        sender = None
        if upstream and self.latency_s:
            late = asyncio.Queue()
            sender = asyncio.ensure_future(self._deliver(late, dst))
        try:
            while data := await src.read(READ_BYTES):
                while self.mode == "silent":  # hold everything: the peer waits as on a dead store
                    await asyncio.sleep(0.05)
                if upstream:
                    for m in REQUEST_LINE.finditer(data):
                        if m.start() == 0 or data[m.start() - 2 : m.start()] == b"\r\n":
                            self.requests.append((m.group(1).decode(), m.group(2).decode()))
                            head = data[m.start() : data.find(b"\r\n\r\n", m.start()) + 2]
                            self._note_range(m.group(2).decode(), head)
                            if EXPECT_HEADER.search(head):
                                self.expect_continue.append(self.requests[-1])
                            if self.timeline is not None:
                                self.timeline.append((conn, time.perf_counter(), m.group(2).decode(), 0))
                    if late is not None and sender is not None:
                        if sender.done():
                            sender.result()  # what ended the delivery (the store closed) ends this side too
                        late.put_nowait((asyncio.get_running_loop().time() + self.latency_s, data))
                        continue
                else:
                    self.bytes_down += len(data)
                    if self.timeline is not None:
                        self.timeline.append((conn, time.perf_counter(), None, len(data)))
                dst.write(data)
                await dst.drain()
            if late is not None and sender is not None:
                late.put_nowait(None)
                await sender  # everything read is delivered before the end of the stream
        finally:
            if sender is not None:
                with contextlib.suppress(RuntimeError):  # (a proxy stopped with pieces in flight: its loop is gone)
                    sender.cancel()
        if counted is not None and counted[0]:  # the store closed it: no longer open (its answer is whole)
            counted[0] = False
            self.open_now -= 1
        dst.write_eof() if dst.can_write_eof() else None

    async def _deliver(self, late: asyncio.Queue[tuple[float, bytes] | None], dst: asyncio.StreamWriter) -> None:
        """Write each piece of LATE to DST when it is due, in order, until None."""
        loop = asyncio.get_running_loop()
        while (item := await late.get()) is not None:
            due, data = item
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            dst.write(data)
            await dst.drain()

    def _note_range(self, path: str, head: bytes) -> None:
        """Keep how many bytes a ranged request asks for (its headers, as far as this piece holds them)."""
        r = RANGE_HEADER.search(head)
        if r is None:
            return
        first, last = r.group(1), r.group(2)
        if first:
            asked = int(last) - int(first) + 1 if last else -1  # `A-`: to the end, size unknown here
        else:
            asked = int(last)
        self.ranges.append((path, asked))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HOST:PORT of the store")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to each request")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    proxy = Proxy(int(port), args.latency, host, args.port).start()
    print(f"listening on 127.0.0.1:{proxy.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()
