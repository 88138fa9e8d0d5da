"""Review 34: a controller certificate, key or CA file that has become a FIFO (or anything else
that is no regular file) since `PUT /v1/controller` is refused before it is opened: a 502
naming the file, as for a missing one. Opening it blocked the controller's event loop at the
next dial (every route stopped answering, and SIGTERM did not end the process). A real
controller, a real mutual-TLS agent and certificates made by `fuse host cert issue`."""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx
import pytest

from .conftest import free_port, start_agent, start_controller


@pytest.mark.parametrize("which", ["ca", "cert", "key"])
def test_an_identity_file_become_a_fifo_is_a_502_naming_it_and_the_controller_goes_on(
        pki, processes, tmp_path, which):
    ident = tmp_path / "id"
    ident.mkdir()
    files = {"cert": ident / "controller.pem", "key": ident / "controller.key", "ca": ident / "ca.pem"}
    shutil.copy(pki.controller / "controller.pem", files["cert"])
    shutil.copy(pki.controller / "controller.key", files["key"])
    shutil.copy(pki.ca / "ca.pem", files["ca"])
    agent = start_agent(processes, tmp_path / "agent", port=free_port(), tls=pki.files(pki.host, "127.0.0.1"),
                        backend="fake")
    ctl = start_controller(processes, tmp_path / "ctl")
    try:
        http = ctl.http()
        r = http.put("/v1/controller", json={k: str(v) for k, v in files.items()})
        assert r.status_code == 200, r.text
        r = http.post("/v1/hosts", json={"id": "e", "url": agent.tls_addr, "backend": "qemu",
                                         "capacity": {"vm_count": 4}})
        assert r.status_code == 201, r.text
        # the file is replaced by a FIFO (a renewal tool, a mistaken path); the agent's restart
        # drops the open connection, so the next poll dials again and reads the files
        files[which].unlink()
        os.mkfifo(files[which])
        agent.proc.stop()
        time.sleep(3)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(ctl.socket)), base_url="http://c",
                          timeout=5) as quick:
            assert quick.get("/v1/healthz").status_code == 200  # (it was no answer at all)
            # a dial now (registering another mutual-TLS host) is refused at once, naming the file
            r = quick.post("/v1/hosts", json={"id": "f", "url": f"127.0.0.1:{free_port()}", "backend": "qemu",
                                              "capacity": {"vm_count": 4}})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == "host_unreachable", err
        named = "(its path is in the controller's log)" if which == "key" else str(files[which])
        assert f"{named} is a named pipe (FIFO), not a regular file" in err["message"], err["message"]
        assert str(files["key"]) not in err["message"]  # (a key's path is never in a reply)
        # SIGTERM ends it, as it ends a controller at rest
        ctl.proc.proc.send_signal(signal.SIGTERM)
        ctl.proc.proc.wait(15)
    finally:
        ctl.close()  # (SIGKILL after 10 s: what ended one frozen in the FIFO's open)
