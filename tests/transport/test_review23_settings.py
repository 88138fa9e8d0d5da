"""PUT /v1/controller replaces every setting: one that names only the placement while the
controller has a mutual-TLS identity is refused (was: 200, and the identity dropped, every
mutual-TLS host disconnected); nulls clear it."""

from __future__ import annotations

from starlette.testclient import TestClient

from fuse.controller.app import create_app
from fuse.controller.service import Controller


def test_a_put_that_would_drop_the_identity_is_refused_and_nulls_clear_it(pki, tmp_path):
    ctl = Controller(tmp_path / "ctl")
    try:
        http = TestClient(create_app(ctl))
        cert, key, ca = pki.files(pki.controller, "controller")
        assert http.put("/v1/controller", json={"cert": cert, "key": key, "ca": ca}).status_code == 200
        r = http.put("/v1/controller", json={"placement": "best_fit"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
        assert "would drop the controller's mutual-TLS identity" in r.json()["error"]["message"]
        assert http.get("/v1/controller").json()["key_set"] is True  # nothing changed
        r = http.put("/v1/controller", json={"cert": None, "key": None, "ca": None, "placement": "best_fit"})
        assert r.status_code == 200 and r.json()["key_set"] is False and r.json()["cert"] is None
        assert http.put("/v1/controller", json={"placement": "best_fit"}).status_code == 200  # none to drop
    finally:
        ctl.store.close()


def test_the_sdk_says_the_same_and_clears_on_request(pki, tmp_path):
    import fuse
    from support import start_controller

    ctl = start_controller(tmp_path)
    try:
        with fuse.Client(ctl.url) as c:
            cert, key, ca = pki.files(pki.controller, "controller")
            c.controller.configure(cert=cert, key=key, ca=ca)
            try:
                c.controller.configure(placement="best_fit")
            except fuse.ApiError as err:
                assert err.code == "invalid_argument"
            else:
                raise AssertionError("a configure without the files dropped the identity")
            assert c.controller.get()["key_set"] is True
            assert c.controller.configure(clear=True)["key_set"] is False
    finally:
        ctl.stop()
