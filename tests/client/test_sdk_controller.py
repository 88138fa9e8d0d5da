"""client.controller on both clients against a real controller: GET/PUT
/v1/controller (seed 004's controller settings) were the one resource no SDK
method reached (review 17)."""

from __future__ import annotations

import pytest

import fuse
from support import reap, start_controller


@pytest.fixture
def ctl(tmp_path):
    c = start_controller(tmp_path)
    yield c
    c.stop()
    reap(tmp_path)


def test_the_sync_client_reads_and_replaces_the_settings(ctl, tmp_path):
    with fuse.Client(ctl.url) as c:
        assert c.controller.get() == {"cert": None, "ca": None, "placement": "best_fit", "key_set": False}
        with pytest.raises(fuse.ApiError) as err:
            c.controller.configure(cert=str(tmp_path / "none.pem"))
        assert (err.value.status, err.value.code) == (400, "invalid_argument")
        assert "give all three or none" in err.value.message
        with pytest.raises(fuse.ApiError) as err:
            c.controller.configure(cert=str(tmp_path / "c.pem"), key=str(tmp_path / "k.pem"), ca=str(tmp_path / "ca.pem"))
        assert err.value.status == 400 and "no file at" in err.value.message
        assert c.controller.configure() == {"cert": None, "ca": None, "placement": "best_fit", "key_set": False}


async def test_the_async_client_reads_the_settings(ctl):
    async with fuse.AsyncClient(ctl.url) as c:
        assert (await c.controller.get())["placement"] == "best_fit"
        assert (await c.controller.configure())["key_set"] is False
