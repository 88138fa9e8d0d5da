"""The published folsom-fuse client works against fuse unchanged. Its import
name is also `fuse`, so it runs in a subprocess with its own site dir."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, fuse
    c = fuse.Client(sys.argv[1], sys.argv[4])
    h = c.hosts.register(fuse.RegisterHostRequest(id="prod-east-1", url=sys.argv[2], token=sys.argv[3],
        region="us-east", backend="qemu", capacity=fuse.HostCapacity(vm_count=20, cpus=512)))
    assert h.id == "prod-east-1" and h.capacity.ram_mb > 0 and h.warnings, h
    assert [x.id for x in c.hosts.list()] == ["prod-east-1"]
    c.hosts.cordon("prod-east-1"); assert c.hosts.get("prod-east-1").state == "cordoned"
    c.hosts.uncordon("prod-east-1"); assert c.hosts.get("prod-east-1").state == "active"
    try:
        c.hosts.get("nope")
    except fuse.ApiError as e:
        assert e.status == 404 and fuse.is_not_found(e), e
    else:
        raise SystemExit("expected 404")
    try:
        c.hosts.register(fuse.RegisterHostRequest(id="x", url=sys.argv[2], token=sys.argv[3],
                         capacity=fuse.HostCapacity(vm_count=0)))
    except fuse.ApiError as e:
        assert e.status == 400 and fuse.is_invalid_argument(e), e
    else:
        raise SystemExit("expected 400")
    page = c.hosts.list_page(limit=1)
    assert len(page.hosts) == 1
    c.hosts.deregister("prod-east-1")
    assert c.hosts.list() == []
    print("FOLSOM-OK", fuse.__file__)
""")


@pytest.fixture(scope="session")
def folsom_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("folsom-site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                        "folsom-fuse"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"pip could not install folsom-fuse: {r.stderr[-800:]}")
    return site


def test_folsom_fuse_client_drives_the_hosts_api(folsom_site, tmp_path, agent):
    from support import start_controller
    ctl = start_controller(tmp_path, listen=True, token="ctl-token")
    try:
        script = tmp_path / "folsom_check.py"
        script.write_text(SCRIPT)
        # folsom-fuse takes a token and http(s) base URL; httpx and pydantic come from our environment.
        env = {**os.environ, "PYTHONPATH": str(folsom_site)}
        r = subprocess.run([sys.executable, "-s", str(script),
                            f"http://127.0.0.1:{ctl.extra['port']}", agent.url, agent.token, "ctl-token"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert "FOLSOM-OK" in r.stdout, r.stdout + r.stderr
        assert str(folsom_site) in r.stdout
    finally:
        ctl.stop()
