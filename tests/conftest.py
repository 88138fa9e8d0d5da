from __future__ import annotations

import os

import pytest

from support import Postgres, reap, start_agent, start_controller

# The controllers the suite starts (hundreds) leave the solver libraries to the first plan,
# which loads them before its clock starts (README; tests/controller/test_planner_warm.py
# checks the default): ~1 s of CPU and ~200 MB each on a 2-core machine.
os.environ.setdefault("FUSE_PLANNER_WARM", "0")


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
def fake_agent(tmp_path):
    """An agent process on the fake backend (token ``agent-token``); its VMs' processes reaped after."""
    p = start_agent(tmp_path, backend="fake")
    yield p
    p.stop()
    reap(tmp_path)


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


@pytest.fixture(autouse=True)
def _reap_what_the_test_left(request):
    """After every test with a ``tmp_path`` (and after its own fixtures' teardown: this one is
    set up first, so torn down last), kill whatever still mentions that dir: a test's agents
    stopped, their VMs' processes go on by design, and a fixture that forgot ``reap`` left them
    running for the rest of the run (a whole suite left ~30 fake VMs behind)."""
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if path is not None:
        reap(path)
