from __future__ import annotations

import pytest

from support import Postgres, start_agent, start_controller


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
