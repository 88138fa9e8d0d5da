"""/v1/controller: the controller's own settings (its client certificate for
mutual-TLS hosts, and the placement policy)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ...errors import InvalidArgument
from ...models.base import Record
from ...models.errors import STORE_ROUTES, responses

router = APIRouter(tags=["controller"], responses=STORE_ROUTES)


class ControllerSettings(Record):
    cert: Optional[str] = None
    key: Optional[str] = None
    ca: Optional[str] = None
    placement: Literal["best_fit"] = "best_fit"


class ControllerSettingsView(Record):
    """The settings as GET and PUT answer them: the key's path is never shown, only whether
    one is set."""
    cert: Optional[str] = Field(description="The client certificate's path; null: none set.")
    ca: Optional[str] = Field(description="The CA file's path; null: none set.")
    placement: Literal["best_fit"]
    key_set: bool = Field(description="Whether a key is set (its path is a secret's location).")


def _public(s: dict) -> dict:
    # The key's path is a secret's location; the settings never show it. The
    # shape is the same before any PUT: fields not set are null.
    shown = {"cert": None, "ca": None, "placement": "best_fit"}
    return shown | {k: v for k, v in s.items() if k != "key"} | {"key_set": bool(s.get("key"))}


@router.get("/v1/controller", response_model=ControllerSettingsView,
            summary="getController: settings, without the key.")
async def get_controller(request: Request) -> JSONResponse:
    return JSONResponse(_public(request.app.state.ctl.settings()))


@router.put("/v1/controller", response_model=ControllerSettingsView,
            summary="putController: replace the settings (certificate, key, CA, placement).",
            responses=responses(s400="invalid_argument: cert, key and ca not all given (or none), one of them empty, "
                                     "none of them "
                                     "given while the controller has an identity (null each to clear it), a relative "
                                     "path, a file that is not there or is not a regular file (a FIFO, a directory, a device: the message says "
                                     "which), a key that is not the certificate's, a CA file holding no "
                                     "certificate, a certificate that is not valid now (expired or not yet valid: "
                                     "the message names the file and its dates), a certificate that is not a "
                                     "client's (a host's serverAuth one), a CA file holding a certificate that is "
                                     "no CA, or a body that does not parse"))
async def put_controller(request: Request, body: ControllerSettings) -> JSONResponse:
    for f in ("cert", "key", "ca"):
        if getattr(body, f) is not None and not getattr(body, f).strip():
            # (empty strings read as not given: they cleared the identity past the check below)
            raise InvalidArgument(f"{f}: an empty path names no file: give an absolute path, or null to clear it")
    given = [f for f in ("cert", "key", "ca") if getattr(body, f)]
    if not given and not ({"cert", "key", "ca"} & body.model_fields_set) and \
            request.app.state.ctl.settings().get("key"):
        # (a PUT replaces every setting: one naming only the placement dropped the identity,
        # and every mutual-TLS host disconnected; clearing it is said with nulls)
        raise InvalidArgument("this PUT would drop the controller's mutual-TLS identity (a PUT replaces every "
                              "setting): give cert, key and ca again, or each as null to clear it")
    if given and len(given) != 3:
        raise InvalidArgument("cert, key and ca go together: give all three or none")
    from ...transport import IdentityError, TlsSettings, _regular_file
    for f in given:
        if not Path(getattr(body, f)).is_absolute():
            # (read from the controller's working directory, not the caller's; and again by
            # a controller started elsewhere: kept relative, it named another file or none)
            raise InvalidArgument(f"{f}: {getattr(body, f)} is a relative path: give an absolute one "
                                  "(the controller reads it, from wherever it runs)")
        if not os.path.exists(getattr(body, f)):
            raise InvalidArgument(f"{f}: no file at {getattr(body, f)}")
        try:  # (a FIFO, a directory or /dev/null was "no file at" too: say what is there, as a dial does)
            _regular_file(getattr(body, f), f"{f}:")
        except IdentityError as exc:
            raise InvalidArgument(str(exc)) from None
    if given:
        tls = TlsSettings(body.cert, body.key, body.ca)
        try:
            tls.context()
        except Exception as exc:
            raise InvalidArgument(f"the certificate, key and CA do not load together: {exc}") from None
        try:  # one that loads but is not valid now: every mutual-TLS host would refuse it
            tls.check_dates()
        except IdentityError as exc:
            raise InvalidArgument(f"cert: {exc}") from None
        try:  # nor one that is not a client's, nor a CA file holding no CA
            tls.check_purposes()
        except IdentityError as exc:
            raise InvalidArgument(str(exc)) from None
    ctl = request.app.state.ctl
    ctl.store.put_setting("controller", body.model_dump(exclude_none=True))
    return JSONResponse(_public(ctl.settings()))
