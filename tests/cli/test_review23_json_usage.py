"""Under --json, a flag click itself refuses is the API's error body on one line, exit 2
(was: click's usage box on stderr, --json ignored)."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import FUSE


@pytest.mark.parametrize("args, says", [
    (["controller", "hosts", "list", "--json", "--bogus"], "No such option: --bogus"),
    (["controller", "hosts", "remove", "--json"], "Missing argument 'HOST_ID'"),
    (["controller", "usage", "--json", "--from"], "Option '--from' requires an argument"),
    (["host", "probe", "--json", "--state-dir"], "Option '--state-dir' requires an argument"),
])
def test_a_usage_error_under_json_is_one_json_line(args, says):
    r = subprocess.run(FUSE + args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    err = json.loads(line)["error"]
    assert err["code"] == "invalid_argument" and says.lower() in err["message"].lower(), err


def test_without_json_it_is_clicks_usage_text():
    r = subprocess.run(FUSE + ["controller", "hosts", "list", "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "No such option" in r.stderr and not r.stderr.lstrip().startswith("{")
