from __future__ import annotations

import pytest

from support import start_agent


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """The registry only reads an agent's probe: one agent serves a module."""
    p = start_agent(tmp_path_factory.mktemp("agent"))
    yield p
    p.stop()
