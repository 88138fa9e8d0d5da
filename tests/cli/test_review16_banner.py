"""``fuse host serve`` says it listens once it does: its startup settles the accelerator
first (a KVM boot probe of up to 10 s), and the banner used to come before that, so a
script that registered the agent on seeing it got 502 for ~10 s."""

from __future__ import annotations

import os
import select
import subprocess
import time

import httpx

from support import FUSE, free_port, install_bundle, real_bundle_dir


def test_the_agents_banner_comes_once_its_listener_answers(tmp_path):
    state = tmp_path / "agent"
    install_bundle(real_bundle_dir(), state)  # (with /dev/kvm, the accelerator probe boots it: seconds)
    port = free_port()
    env = {**os.environ, "FUSE_CACHE_DIR": "off"}  # (no machine-wide answer cached: the probe runs)
    p = subprocess.Popen(FUSE + ["host", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(state),
                                 "--backend", "qemu", "--token", "t", "--socket", str(tmp_path / "a.sock")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                         start_new_session=True)
    try:
        deadline, line = time.monotonic() + 90, b""
        while b"fuse host agent:" not in line and time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], 1)
            if ready:
                line = p.stdout.readline()
                assert line or p.poll() is None, "the agent exited"
        assert f"listen 127.0.0.1:{port}".encode() in line, line
        # at once: no retry
        r = httpx.get(f"http://127.0.0.1:{port}/v1/host", headers={"Authorization": "Bearer t"}, timeout=5)
        assert r.status_code == 200
    finally:
        p.terminate()
        p.wait(timeout=30)
