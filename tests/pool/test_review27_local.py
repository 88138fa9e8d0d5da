"""Twenty-seventh session: the local cloud removes only what it made (its ``dir`` is any path a
caller names: a machine's name falling on a directory of someone else's deleted it, and
SIGKILLed every process naming it)."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from fuse.controller.pool.providers import link
from fuse.errors import Conflict
from support import reap


async def test_a_machine_dir_that_is_not_the_clouds_is_left_alone_and_refused(tmp_path):
    victim = tmp_path / "victim"
    (victim / "ops-1").mkdir(parents=True)
    (victim / "ops-1" / "data.txt").write_text("precious")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(victim / "ops-1" / "worker")])
    p = link("local", "ops", {"backend": "fake", "dir": str(victim)}, tmp_path / "state")
    try:
        with pytest.raises(Conflict, match="not a machine of cloud"):
            await p.create(host_name="ops-1", type_name="local.small", region="local", agent_token="t" * 20)
        assert (victim / "ops-1" / "data.txt").read_text() == "precious"
        assert bystander.poll() is None
        # a name of its own is made owner-only, its record and log too
        m = await p.create(host_name="ops-2", type_name="local.small", region="local", agent_token="t" * 20)
        d = victim / "ops-2"
        for path in (d, d / "machine.json", d / "agent.log"):
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
        await p.terminate(m.id)
    finally:
        bystander.kill()
        bystander.wait()
        await p.close()
        reap(victim)  # (an agent started in someone's dir, by the code before the fix, included)


async def test_a_machine_dir_its_own_create_left_without_a_record_is_cleaned_and_used(tmp_path, monkeypatch):
    """A create cut short before its record (its bundle not installed, say) leaves a dir the
    cloud made: the next create of that name cleans it, it is not refused as someone else's."""
    p = link("local", "ops", {"backend": "fake", "dir": str(tmp_path / "m")}, tmp_path / "state")
    try:
        def broken(d):
            raise OSError("no space left on device")
        monkeypatch.setattr(p, "_install_bundle", broken)
        with pytest.raises(OSError):
            await p.create(host_name="ops-1", type_name="local.small", region="local", agent_token="t" * 20)
        assert (tmp_path / "m" / "ops-1").is_dir() and not (tmp_path / "m" / "ops-1" / "machine.json").exists()
        monkeypatch.undo()
        m = await p.create(host_name="ops-1", type_name="local.small", region="local", agent_token="t" * 20)
        assert (tmp_path / "m" / "ops-1" / "machine.json").is_file()
        await p.terminate(m.id)
    finally:
        await p.close()
        reap(tmp_path / "m")
