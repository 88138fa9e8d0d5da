"""Review 30: a request sent on a kept-alive connection while the server is stopped past its
keep-alive time (a SIGSTOP, a stalled machine) is answered when it resumes: the keep-alive
timer ran before the bytes were read and closed the connection with them unread (a reset;
a sleep sent to an agent stopped 10 s was lost, reported 502 "it may still sleep it")."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from support import reap, start_agent


def test_a_request_sent_while_the_agent_was_stopped_past_its_keep_alive_is_answered(tmp_path):
    agent = start_agent(tmp_path, backend="fake")
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {agent.token}"}, timeout=60) as c:
            assert c.get(agent.url + "/v1/host").status_code == 200  # (the connection kept alive)
            agent.popen.send_signal(signal.SIGSTOP)
            resume = threading.Timer(7.0, agent.popen.send_signal, args=(signal.SIGCONT,))
            resume.start()
            try:
                time.sleep(0.5)
                r = c.get(agent.url + "/v1/host")  # (was: ReadError, connection reset by peer)
            finally:
                resume.join()
            assert r.status_code == 200
    finally:
        agent.popen.send_signal(signal.SIGCONT)
        agent.stop()
        reap(tmp_path)
