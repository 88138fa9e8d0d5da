"""The copy step: every state file from the source to the target, verified.

Two paths carry the bytes, in 4 MiB chunks: the bulk protocol (``bulk.py``, a
socket splice between the agents) where both hosts speak it, else HTTP, reading
chunk n+1 from the source while chunk n goes to the target. Either way the
target then hashes what it holds and each SHA-256 is checked against the
source's before the move may wake anything, so a damaged copy never runs.
Progress (``copied_bytes``) is written as it goes, for `fuse controller moves`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time

from ...errors import FuseError, HostUnreachable
from . import hooks
from .records import IO_TIMEOUT, MoveRecords

VERIFY_RATE = 50 * 2**20  # bytes a second a loaded host hashes at the least (SHA-256 runs at 0.5-2 GB/s)

CHUNK = 4 * 1024 * 1024
# A chunk read changes nothing, so one that met a dropped connection (an agent
# closes a kept-alive one after ~5 s idle, as slow chunks leave them) is sent
# again this many times before it fails the move. Nothing else is retried.
CHUNK_READ_RETRIES = 3


class MoveCopy(MoveRecords):
    """Copying a slept VM's files to the target and verifying them."""

    async def _copy(self, row: dict) -> None:
        """Begin the target's incoming side, copy every file in 4 MiB chunks
        (the bulk protocol where both hosts speak it, else HTTP), then have
        the target hash what it holds and check each SHA-256 against the
        source's."""
        row = await self._begin(row)
        rec = row["record"]
        src, dst = await self._outlast(f"move {row['id']}", lambda: (self._bulk_endpoint(row["source"]),
                                                                     self._bulk_endpoint(row["target"])))
        await self._write(row["id"], copy_path="bulk" if src and dst else "http")
        t0 = time.monotonic()
        if src and dst:
            await self._copy_bulk(row, src, dst)
        else:
            await self._copy_http(row)
        t1 = time.monotonic()
        # the target hashes every byte before it answers: FUSE_MOVE_IO_TIMEOUT, and a second more
        # for each VERIFY_RATE of it (a fixed 120 s kept a guest paused that long behind a
        # target that stopped once the last chunk was in)
        total = sum(f["size"] for f in rec["files"])
        what = f"the check of move {row['id']}'s files (verify)"
        got = self._answer(await self._host(row["target"], "POST", f"/v1/host/incoming/{row['id']}/verify",
                                            timeout=IO_TIMEOUT + total / VERIFY_RATE), row["target"], what)
        if not isinstance(got.get("files"), list) or not all(isinstance(f, dict) and "name" in f for f in got["files"]):
            raise HostUnreachable(f"host {row['target']} answered {what} without the list of files a fuse agent "
                                  "answers with")
        theirs = {f["name"]: f for f in got["files"]}
        for f in rec["files"]:
            have = theirs.get(f["name"], {})
            if have.get("size") != f["size"] or have.get("sha256") != f["sha256"]:
                raise FuseError(f"file {f['name']} does not match on {row['target']}: {have.get('size')} bytes "
                                f"sha256 {str(have.get('sha256'))[:12]}, the source's {f['size']} bytes "
                                f"sha256 {f['sha256'][:12]}")
        await self._write(row["id"], copy_secs=round(t1 - t0, 4), verify_secs=round(time.monotonic() - t1, 4))

    def _bulk_endpoint(self, host: str):
        """Operators behind something that passes only HTTP can set
        FUSE_MOVE_COPY_PATH=http; the default takes the bulk protocol wherever
        both hosts speak it."""
        from ..bulk import endpoint
        if os.environ.get("FUSE_MOVE_COPY_PATH", "auto") == "http":
            return None
        view = self.fleet.views.get(host)
        return endpoint(host, self.fleet.conn(host), view.summary if view else {})

    def _chunks(self) -> tuple[int, float]:
        """Test hooks: the chunk to damage in flight, and a pause after each
        chunk (so a test can act while a copy is under way)."""
        return (int(os.environ.get("FUSE_TEST_CORRUPT_CHUNK", "-1")),
                float(os.environ.get("FUSE_TEST_CHUNK_DELAY", "0")))

    async def _copy_bulk(self, row: dict, src, dst) -> None:
        from ..bulk import copy_file
        corrupt_at, delay = self._chunks()
        count = {"chunks": 0, "bytes": 0}

        sockets: list[socket.socket] = []
        stop = threading.Event()

        def opened(sock: socket.socket) -> None:
            sockets.append(sock)
            if stop.is_set():
                sock.close()
                raise FuseError("the copy was stopped")

        def on_chunk(n: int) -> None:
            if stop.is_set():
                raise FuseError("the copy was stopped")
            count["chunks"] += 1
            count["bytes"] += n
            if os.environ.get("FUSE_TEST_CRASH_AT"):
                self._set(row["id"], copied_bytes=count["bytes"])
            hooks.crash_point(f"chunk:{count['chunks']}")
            if delay:
                stop.wait(delay)  # (a stop, waited for, ends the test's pause at once)

        def run() -> None:
            for f in row["record"]["files"]:
                if stop.is_set():
                    raise FuseError("the copy was stopped")
                copy_file(src, dst, vm=row["vm"], move=row["id"], file=f["name"], size=f["size"],
                          timeout=IO_TIMEOUT, on_chunk=on_chunk, opened=opened,
                          corrupt=lambda n: count["chunks"] + 1 == corrupt_at)

        job = asyncio.ensure_future(asyncio.to_thread(run))
        job.add_done_callback(lambda f: f.cancelled() or f.exception())  # (read below, or this stop's)
        try:
            while True:
                done, _ = await asyncio.wait({job}, timeout=0.25)
                self._progress(row["id"], count["bytes"])
                if done:
                    try:
                        return job.result()
                    except OSError as exc:  # (one while a copy connection opens comes unwrapped)
                        raise HostUnreachable(f"copying from {row['source']} to {row['target']} failed: "
                                              f"{exc}") from exc
        finally:
            if not job.done():
                # Whatever ends the wait first (a cancel, the move taken over by another replica,
                # a write that failed) stops the copying thread and waits for it: it read on from
                # the source after a take-over, and its error was logged as a task's never read
                # (review 36). Its sockets shut down, its splice or read fails at once; a connect
                # still under way ends within the IO timeout, and `opened` closes its socket.
                stop.set()
                for sock in sockets:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                await asyncio.wait({job})

    async def _copy_http(self, row: dict) -> None:
        rec = row["record"]
        plan = [(f, off, min(CHUNK, f["size"] - off)) for f in rec["files"] for off in range(0, f["size"], CHUNK)]
        corrupt, delay = self._chunks()

        async def fetch(i: int) -> bytes:
            f, offset, length = plan[i]
            data = (await self._host(row["source"], "GET", f"/v1/host/vms/{row['vm']}/files/{f['name']}",
                                     params={"offset": offset, "length": length}, timeout=IO_TIMEOUT,
                                     retries=CHUNK_READ_RETRIES)).content
            if len(data) != length:
                raise FuseError(f"short read of {f['name']} at {offset}: {len(data)} of {length} bytes")
            return data

        # Read chunk n+1 from the source while chunk n goes to the target.
        ahead = asyncio.create_task(fetch(0)) if plan else None
        copied, saved_at = 0, time.monotonic()
        try:
            for i, (f, offset, length) in enumerate(plan):
                data = await ahead
                ahead = asyncio.create_task(fetch(i + 1)) if i + 1 < len(plan) else None
                if i + 1 == corrupt:  # test hook: a chunk damaged in flight
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                await self._host(row["target"], "PUT", f"/v1/host/incoming/{row['id']}/files/{f['name']}",
                                 params={"offset": offset}, content=data, timeout=IO_TIMEOUT)
                copied += length
                if time.monotonic() - saved_at > 0.25 or i + 1 == len(plan) or os.environ.get("FUSE_TEST_CRASH_AT"):
                    self._progress(row["id"], copied)
                    saved_at = time.monotonic()
                hooks.crash_point(f"chunk:{i + 1}")
                if delay:
                    await asyncio.sleep(delay)
        finally:
            if ahead is not None:
                ahead.cancel()
