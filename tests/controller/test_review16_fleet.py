"""Moves, from a sixteenth review of the fleet controller: ``vm`` and seed 004's
``flashvm`` are two names for one field, so a request giving both must name one
VM. Two different names were taken as ``vm`` alone (202, and the VM ``flashvm``
named stayed where it was); now they are 400 ``invalid_argument`` naming both,
from the route and from the service any other caller (the drain, the MCP tool)
goes through. In process: nothing here needs a host."""

from __future__ import annotations

import asyncio

import pytest

from fuse.controller.service import Controller
from fuse.errors import InvalidArgument
from test_controller_settings import http  # noqa: F401  (the fixture: the controller's API in process)

TWO_VMS = {"flashvm": "sv1", "vm": "tv1"}


def test_a_move_naming_two_different_vms_as_vm_and_flashvm_is_invalid_argument_naming_both(http):
    r = http.post("/v1/moves", json=TWO_VMS)
    # (it was 202: tv1 moved, sv1 ignored)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument", err
    assert err["message"].startswith("vm 'tv1' and flashvm 'sv1' name different VMs"), err
    assert http.get("/v1/moves").json() == {"moves": []}


def test_the_same_name_as_vm_and_flashvm_is_one_vm_and_goes_on_to_be_looked_up(http):
    r = http.post("/v1/moves", json={"flashvm": "sv1", "vm": "sv1"})
    assert r.status_code == 409, r.text  # past validation: there is no VM sv1 to move
    assert r.json()["error"]["code"] == "not_movable", r.text


def test_the_move_service_refuses_two_different_vms_from_any_caller(tmp_path):
    """The drain and the MCP tool hand the service a dict, not the route's model."""
    ctl = Controller(tmp_path / "ctl")
    try:
        with pytest.raises(InvalidArgument) as info:
            asyncio.run(ctl.moves.create(dict(TWO_VMS)))
        assert info.value.message.startswith("vm 'tv1' and flashvm 'sv1' name different VMs"), info.value.message
    finally:
        ctl.store.close()
