"""A stand-in for the `firecracker` binary: serves the subset of
Firecracker's API fuse uses on --api-sock, enforcing the documented contract
(required fields, path id = body id, call order), and logs every request as
a JSON line to ``<api-sock>.requests`` so tests can compare against the
recorded contract. Replies are Firecracker's: 204, or 400 with
``{"fault_message": ...}``.

Run as a script (like the real binary) or use ``FakeFirecracker`` in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

REQUIRED = {
    ("PUT", "/machine-config"): {"vcpu_count": int, "mem_size_mib": int},
    ("PUT", "/boot-source"): {"kernel_image_path": str},
    ("PUT", "/drives/"): {"drive_id": str, "path_on_host": str, "is_root_device": bool, "is_read_only": bool},
    ("PUT", "/actions"): {"action_type": str},
    ("PATCH", "/vm"): {"state": str},
    ("PUT", "/snapshot/create"): {"snapshot_path": str, "mem_file_path": str},
    ("PUT", "/snapshot/load"): {"snapshot_path": str, "mem_backend": dict},
}


class FakeFirecracker:
    """The API's state: not started -> running <-> paused; a process that
    loads a snapshot must not have been configured first."""

    def __init__(self, log: Path, out=None):
        self.log, self.out = log, out or sys.stdout
        self.state, self.configured = "not_started", set()

    def handle(self, method: str, path: str, body: dict) -> tuple[int, dict | None]:
        with open(self.log, "a") as f:
            f.write(json.dumps({"method": method, "path": path, "body": body}) + "\n")
        key = (method, "/drives/" if path.startswith("/drives/") else path)
        if key not in REQUIRED:
            return 400, {"fault_message": f"Invalid request method and/or path: {method} {path}"}
        for field, kind in REQUIRED[key].items():
            if not isinstance(body.get(field), kind):
                return 400, {"fault_message": f"missing or invalid field {field}"}
        if key == ("PUT", "/drives/") and path != f"/drives/{body['drive_id']}":
            return 400, {"fault_message": "The id from the path does not match the id from the body!"}
        if key[1] in ("/machine-config", "/boot-source", "/drives/"):
            if self.state != "not_started":
                return 400, {"fault_message": "The requested operation is not supported after starting the microVM."}
            self.configured.add(key[1])
        elif key[1] == "/actions":
            if body["action_type"] != "InstanceStart" or self.state != "not_started":
                return 400, {"fault_message": "InstanceStart: not allowed now"}
            if not {"/machine-config", "/boot-source"} <= self.configured:
                return 400, {"fault_message": "Cannot start microvm without kernel configuration."}
            self.state = "running"
            print("fake guest booted", file=self.out, flush=True)
        elif key[1] == "/vm":
            if self.state == "not_started" or body["state"] not in ("Paused", "Resumed"):
                return 400, {"fault_message": "bad vm state change"}
            self.state = "paused" if body["state"] == "Paused" else "running"
        elif key[1] == "/snapshot/create":
            if self.state != "paused" or body.get("snapshot_type", "Full") != "Full":
                return 400, {"fault_message": "Cannot create a snapshot of a running microVM."}
            Path(body["snapshot_path"]).write_text("fake vm state\n")
            Path(body["mem_file_path"]).write_bytes(b"\0" * 4096)
        elif key[1] == "/snapshot/load":
            if self.state != "not_started" or self.configured:
                return 400, {"fault_message": "Loading a microVM snapshot not allowed after configuring boot-specific resources."}
            if body["mem_backend"].get("backend_type") != "File" or not Path(body["snapshot_path"]).exists():
                return 400, {"fault_message": "cannot load snapshot"}
            self.state = "running" if body.get("resume_vm") else "paused"
            print("fake guest resumed", file=self.out, flush=True)
        return 204, None

    async def serve(self, sock: Path) -> asyncio.AbstractServer:
        return await asyncio.start_unix_server(self._connection, path=str(sock))

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = h.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                raw = await reader.readexactly(length) if length else b""
                status, reply = self.handle(method, path, json.loads(raw) if raw else {})
                payload = json.dumps(reply).encode() if reply else b""
                head = f"HTTP/1.1 {status} {'No Content' if status == 204 else 'Bad Request'}\r\n"
                if payload:
                    head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                writer.write((head + "\r\n").encode() + payload)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def _main(sock: Path) -> None:
    server = await FakeFirecracker(Path(f"{sock}.requests")).serve(sock)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-sock", required=True)
    parser.add_argument("--id", default="")
    asyncio.run(_main(Path(parser.parse_args().api_sock)))
