"""GET /v1/controller has one shape, before any PUT and after one: cert and
ca are null until set, the key's path is never shown (only key_set)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller

SHAPE = {"cert", "ca", "placement", "key_set"}


@pytest.fixture
def http(tmp_path):
    ctl = Controller(tmp_path / "ctl")
    yield TestClient(create_app(ctl))
    ctl.store.close()


def test_before_any_put_the_certificate_fields_are_null(http):
    assert http.get("/v1/controller").json() == {"cert": None, "ca": None, "placement": "best_fit", "key_set": False}


def test_a_put_without_a_certificate_keeps_the_shape(http):
    r = http.put("/v1/controller", json={"placement": "best_fit"})
    assert r.status_code == 200 and r.json() == http.get("/v1/controller").json()
    assert set(r.json()) == SHAPE and r.json()["cert"] is None and r.json()["ca"] is None
