"""client.controller: the controller's own settings (GET/PUT /v1/controller)."""

from __future__ import annotations

import os
from typing import Any, Callable

from ._core import Call, record

SETTINGS = record("placement", "key_set")


class ControllerAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def get(self) -> dict:
        """`{"cert", "ca", "placement", "key_set"}`: the settings; the key's path is never shown."""
        return self._send(Call("GET", "/v1/controller", parse=SETTINGS))

    def configure(self, cert: str | None = None, key: str | None = None, ca: str | None = None,
                  placement: str = "best_fit", clear: bool = False) -> dict:
        """Replace the settings (PUT): the client certificate, key and CA the controller
        presents to mutual-TLS hosts (all three, or none) and the placement policy;
        returns them as `get` does. Relative paths are taken from this process's working
        directory (sent absolute: the controller refuses relative ones). A certificate that
        does not load with its key and CA, or is not valid now, is 400 and changes nothing;
        so is a call without them while the controller has them (it would drop them):
        ``clear=True`` drops them."""
        # paths as the caller means them: the controller reads files by absolute path only
        body = {k: os.path.abspath(v) if v else v for k, v in (("cert", cert), ("key", key), ("ca", ca))
                if v is not None}
        if clear:
            if body:
                raise ValueError("clear=True drops the certificate, key and CA: give none of them with it")
            body = {"cert": None, "key": None, "ca": None}
        return self._send(Call("PUT", "/v1/controller", body=body | {"placement": placement}, parse=SETTINGS))
