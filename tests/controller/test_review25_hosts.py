"""Host registry, from review 25 (issue 2): a registration's fresh probe of a machine whose
nvidia-smi is slow (seconds a call: many GPUs, no persistence daemon) answers with the facts
the agent probed at its start, with a warning, instead of timing out the controller."""

from __future__ import annotations

import os
import time

import fuse
from fuse import HostCapacity
from support import start_agent, start_controller

SLOW_SMI = """#!/bin/sh
# slow from the moment the test says so: the agent's start-up probe is quick
if [ -e "{slow}" ]; then sleep 11; fi
echo "NVIDIA A100-SXM4-80GB, GPU-aaaa, 00000000:07:00.0, 81920, 535.104.05, Disabled"
"""


def test_a_slow_fresh_probe_registers_the_host_with_its_start_up_facts_and_a_warning(tmp_path):
    bin_dir, slow = tmp_path / "bin", tmp_path / "slow"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(SLOW_SMI.format(slow=slow))
    (bin_dir / "nvidia-smi").chmod(0o755)
    agent = start_agent(tmp_path, backend="fake", name="a1",
                        env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "FUSE_FRESH_PROBE_S": "1"})
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    try:
        slow.touch()
        t0 = time.monotonic()
        # (was: 502 host_unreachable "did not answer in time" with nvidia-smi at 6 s a call; with
        # cpus/ram/storage declared, "probe skipped, host unreachable" and the GPUs lost)
        host = client.hosts.register(fuse.RegisterHostRequest(
            id="g1", url=agent.url, token=agent.token, backend="qemu", capacity=HostCapacity(vm_count=2)))
        assert time.monotonic() - t0 < 8
        assert host.connected and host.capacity.gpus == 1 and host.capacity.gpu_kind == "nvidia:A100"
        assert host.capacity.cpus > 0 and host.capacity.ram_mb > 0 and host.capacity.arch
        assert [w for w in host.warnings if "fresh probe did not finish within 1 s" in w
                and "facts probed when the agent started" in w] != [], host.warnings
        assert not [w for w in host.warnings if "probe skipped" in w], host.warnings
    finally:
        client.close()
        ctl.stop()
        agent.stop()
