"""Uploads in parts (S3's multipart upload through s3fs): a value stored as it is written.

Parts go in the background on s3fs's event loop, several at once, while the writer appends;
`Store.open_upload_sync` makes them. Nothing is visible before the commit completes the upload.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

from ..errors import StoreError
from .base import Upload
from .failures import describe_failure
from .requests import RequestCounts

# Bytes of the parts of one upload in flight at once (at least one part): with 5 MiB parts,
# six; with the default 50 MiB, one, so that a shard streamed holds at most about two parts.
PART_BYTES_IN_FLIGHT = 32 << 20


class PartsUpload(Upload):
    """One multipart upload of KEY (at PATH in s3fs's file system FS), begun at the first part;
    a value that never fills one part goes in one PUT at the commit."""

    def __init__(self, fs: Any, path: str, key: str, part_bytes: int, requests: RequestCounts) -> None:
        self.fs, self.path, self.key, self.part_bytes, self.requests = fs, path, key, part_bytes, requests
        self.bucket, self.object_key, _ = fs.split_path(path)
        self.buffer = bytearray()
        self.nbytes = 0
        self.upload_id: str | None = None
        self.in_flight: dict[int, concurrent.futures.Future[Any]] = {}  # part number -> its request
        self.etags: dict[int, str] = {}
        self.most_in_flight = max(1, PART_BYTES_IN_FLIGHT // part_bytes)

    def _failed(self, what: str, e: BaseException) -> StoreError:
        return StoreError(f"{what} {self.key!r} failed: {describe_failure(e)}")

    def _start(self, method: str, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """One S3 call on s3fs's loop, going on in the background."""
        coro = self.fs._call_s3(method, Bucket=self.bucket, Key=self.object_key, **kwargs)
        return asyncio.run_coroutine_threadsafe(coro, self.fs.loop)

    def _call(self, what: str, method: str, **kwargs: Any) -> Any:
        try:
            return self._start(method, **kwargs).result()
        except Exception as e:
            raise self._failed(what, e) from None

    def _settle(self, keep: int) -> None:
        """Wait until at most KEEP parts are in flight (the oldest first); a part that failed is raised."""
        for number in sorted(self.in_flight):
            future = self.in_flight[number]
            if not future.done() and len(self.in_flight) <= keep:
                continue
            del self.in_flight[number]
            try:
                self.etags[number] = future.result()["ETag"]
            except Exception as e:
                raise self._failed("uploading", e) from None

    def _send(self, body: bytes) -> None:
        if self.upload_id is None:
            self.upload_id = self._call("starting the upload of", "create_multipart_upload")["UploadId"]
        self._settle(self.most_in_flight - 1)
        number = len(self.etags) + len(self.in_flight) + 1
        self.in_flight[number] = self._start("upload_part", PartNumber=number, UploadId=self.upload_id, Body=body)

    def write_sync(self, data: bytes) -> None:
        self.buffer += data
        self.nbytes += len(data)
        while len(self.buffer) >= self.part_bytes:
            body = bytes(self.buffer[: self.part_bytes])
            del self.buffer[: self.part_bytes]
            self._send(body)

    def commit_sync(self) -> None:
        if self.upload_id is None:  # less than a part: one PUT
            try:
                self.fs.pipe_file(self.path, bytes(self.buffer))
            except Exception as e:
                raise self._failed("writing", e) from None
            self.requests.put(self.nbytes)
            return
        if self.buffer:
            self._send(bytes(self.buffer))
            self.buffer = bytearray()
        self._settle(0)
        parts = [{"PartNumber": n, "ETag": self.etags[n]} for n in sorted(self.etags)]
        self._call(
            "completing the upload of",
            "complete_multipart_upload",
            UploadId=self.upload_id,
            MultipartUpload={"Parts": parts},
        )
        self.upload_id = None
        self.requests.put(self.nbytes, len(parts) + 2)

    def abort_sync(self) -> None:
        concurrent.futures.wait(self.in_flight.values())  # (a part landing after the abort is dropped)
        self.in_flight.clear()
        self.buffer = bytearray()
        if self.upload_id is not None:
            upload_id, self.upload_id = self.upload_id, None
            self._call("aborting the upload of", "abort_multipart_upload", UploadId=upload_id)


class AfterCommit(Upload):
    """An upload that calls ON_COMMIT once its commit was tried (a cache in front forgets the key)."""

    def __init__(self, upload: Upload, on_commit: Callable[[], None]) -> None:
        self.upload, self.on_commit = upload, on_commit

    def write_sync(self, data: bytes) -> None:
        self.upload.write_sync(data)

    def commit_sync(self) -> None:
        try:
            self.upload.commit_sync()
        finally:
            self.on_commit()

    def abort_sync(self) -> None:
        self.upload.abort_sync()
