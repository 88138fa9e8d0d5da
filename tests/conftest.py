from __future__ import annotations

import pytest

from support import Postgres, reap, start_agent, start_controller


@pytest.fixture(scope="session")
def postgres():
    pg = Postgres().start()
    yield pg
    pg.stop()


@pytest.fixture
def agent(tmp_path):
    p = start_agent(tmp_path)
    yield p
    p.stop()


@pytest.fixture
def controller(tmp_path):
    p = start_controller(tmp_path)
    yield p
    p.stop()


@pytest.fixture
def client(controller):
    import fuse
    with fuse.Client(controller.url) as c:
        yield c


@pytest.fixture
def procs(tmp_path):
    """Processes a test starts (append them): stopped last-first, then anything
    left mentioning the test's dir (VMs outlive their agent by design) is killed."""
    started = []
    yield started
    for p in reversed(started):
        p.stop()
    reap(tmp_path)
