"""A move's chunk PUT on a disk that fills up answers only for bytes it wrote: the whole chunk,
or 409 ``host_full`` (the disk full; never a 200 for bytes that did not land, nor a 500 ``internal``)."""

from __future__ import annotations

import hashlib
import os

import httpx

from support import start_agent
from test_review22_agent import fill, tmpfs, unfill

MiB = 2**20
FAKE_PLATFORM = {"backend": "fake", "arch": "amd64", "machine": "fake", "accel": "none"}


def test_a_chunk_the_disk_takes_only_part_of_is_host_full_not_written(tmp_path, procs):
    with tmpfs(tmp_path / "disk", "40m") as disk:
        disk.chmod(0o700)  # (a tmpfs root is 1777: no agent socket in a dir others may write)
        agent = start_agent(disk, backend="fake")
        procs.append(agent)
        h = {"Authorization": f"Bearer {agent.token}"}
        data = os.urandom(16 * MiB)
        fp = httpx.get(f"{agent.url}/v1/host", headers=h).json()["bundles"][0]["fingerprint"]
        body = {"move_id": "m1", "platform": FAKE_PLATFORM,
                "vm": {"name": "v", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "true", "bundle": "linux",
                       "bundle_fingerprint": fp},
                "files": [{"name": "state.bin", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]}
        r = httpx.post(f"{agent.url}/v1/host/incoming", json=body, headers=h)
        assert r.status_code == 201, r.text

        def put(offset: int) -> httpx.Response:
            return httpx.put(f"{agent.url}/v1/host/incoming/m1/files/state.bin", params={"offset": offset},
                             content=data[offset:offset + 4 * MiB], headers=h, timeout=30)

        assert put(0).status_code == 200
        path = agent.state_dir / "vms" / "v" / "state" / "state.bin"
        fill(disk)
        # about 1 MiB free: part of the next chunk fits, not all of it
        os.truncate(disk / "filler", os.path.getsize(disk / "filler") - MiB)
        try:
            for offset in (4 * MiB, 8 * MiB):
                r = put(offset)
                # (was: 200 {"written": 4194304} with ~1 MiB on disk, then 500 internal)
                assert r.status_code == 409, r.text
                assert r.json()["error"]["code"] == "host_full", r.text
                assert "no room on this host's disk" in r.json()["error"]["message"]
        finally:
            unfill(disk)
        # with room again the same chunks land whole, and the copy verifies
        for offset in range(4 * MiB, len(data), 4 * MiB):
            r = put(offset)
            assert r.status_code == 200 and r.json()["written"] == 4 * MiB, r.text
        assert path.stat().st_size == len(data)
        r = httpx.post(f"{agent.url}/v1/host/incoming/m1/verify", headers=h)
        assert r.json()["verified"] is True, r.text
        assert httpx.delete(f"{agent.url}/v1/host/incoming/m1", headers=h).status_code == 204
        agent.stop()
