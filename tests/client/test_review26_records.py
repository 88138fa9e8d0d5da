"""Twenty-sixth session: records a caller builds refuse fields they do not have, as the REST API
refuses them; answers still read fields a newer server adds."""

from __future__ import annotations

import pydantic
import pytest

import fuse


@pytest.mark.parametrize("make, field", [
    (lambda: fuse.RegisterHostRequest(id="h", url="http://127.0.0.1:1", regoin="eu"), "regoin"),
    (lambda: fuse.HostCapacity(cpu=4), "cpu"),
    (lambda: fuse.HostCapacity(vm_count=2, ram_mib=512), "ram_mib"),
    (lambda: fuse.RegisterHostRequest(id="h", url="http://127.0.0.1:1", capacity={"cpu": 4}), "cpu"),
])
def test_a_misspelt_field_of_a_request_record_is_refused_as_it_is_made(make, field):
    """(was: dropped silently: the host registered with the probed capacity and no region)"""
    with pytest.raises(pydantic.ValidationError) as got:
        make()
    assert field in str(got.value) and "extra_forbidden" in str(got.value), got.value


def test_an_answer_with_a_field_this_client_does_not_know_is_still_read():
    host = fuse.Host.model_validate({"id": "h", "capacity": {"cpus": 2, "added_later": 1}, "added_later": True})
    assert host.id == "h" and host.capacity.cpus == 2
    assert fuse.HostCapacity.model_validate({"vm_count": 3, "added_later": 1}).vm_count == 3
    req = fuse.RegisterHostRequest(id="h", url="http://127.0.0.1:1", region="eu",
                                   capacity=fuse.HostCapacity(vm_count=2, cpus=1))
    assert (req.region, req.capacity.vm_count, req.capacity.cpus) == ("eu", 2, 1)
