"""A controller on PostgreSQL whose server stops answering (frozen, a partition: its TCP still
acknowledged, so nothing times out by itself), from review 28: every route, the health check
included, waited for good (> 180 s). A statement unanswered for 4.5 s has its connection cut,
and every route answers 503 db_unavailable at once until the database answers again."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import httpx
import pytest

from support import start_controller


def _server_pids(postgres) -> list[int]:
    pids = [int(p) for p in subprocess.run(["pgrep", "-f", str(postgres.dir)], capture_output=True,
                                           text=True).stdout.split()]
    kids = subprocess.run(["pgrep", "-P", ",".join(map(str, pids))], capture_output=True, text=True).stdout.split()
    return pids + [int(p) for p in kids]


@pytest.mark.timeout(180)
def test_a_database_that_stops_answering_is_503_within_seconds_and_back_when_it_answers(tmp_path, postgres):
    db = postgres.create_db(f"frozen_{uuid.uuid4().hex[:8]}")
    ctl = start_controller(tmp_path, db=db, listen=True, token="C")
    pids = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{ctl.extra['port']}", headers={"Authorization": "Bearer C"},
                          timeout=30) as c:
            assert c.get("/v1/healthz").status_code == 200
            pids = _server_pids(postgres)
            for p in pids:
                os.kill(p, signal.SIGSTOP)
            t = time.monotonic()
            r = c.get("/v1/healthz")
            assert r.status_code == 503 and r.json()["error"]["code"] == "db_unavailable", r.text
            assert time.monotonic() - t < 8, time.monotonic() - t
            for path in ("/v1/hosts", "/v1/vms", "/v1/healthz"):
                t = time.monotonic()
                r = c.get(path)
                assert r.status_code == 503 and r.json()["error"]["code"] == "db_unavailable", (path, r.text)
                assert time.monotonic() - t < 2, (path, time.monotonic() - t)
            for p in pids:
                os.kill(p, signal.SIGCONT)
            pids = []
            deadline = time.monotonic() + 20
            while c.get("/v1/healthz").status_code != 200:
                assert time.monotonic() < deadline, "still 503 after the database answers again"
                time.sleep(0.2)
            assert c.get("/v1/hosts").status_code == 200
    finally:
        for p in pids:
            os.kill(p, signal.SIGCONT)
        ctl.stop()
