"""`fuse controller move` over a stand-in client (no controller): on a pipe
it prints one plain line per change of the move's progress, and under
--json those lines go to stderr so stdout stays one JSON document (an error
then is the API's error body, the last line of stderr)."""

from __future__ import annotations

import contextlib
import json

import pytest

from fuse.cli import controller, moves
from fuse.client import ApiError

MB4, TOTAL = 4 * 1024 * 1024, 10_000_000


def answer(state, copied=0, total=0, reason=""):
    return {"id": "m1", "vm": "job1", "from": "rack1", "to": "rack2", "state": state, "copied_bytes": copied,
            "total_bytes": total, "reason": reason}


class StandIn:
    """`moves.create` answers the first of `answers`, each `moves.get` the next."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.moves = self

    def create(self, vm, to, host):
        return self.answers.pop(0)

    def get(self, move_id):
        return self.answers.pop(0)


@pytest.fixture
def stand_in(monkeypatch):
    def use(answers):
        monkeypatch.setattr(controller, "client", lambda: contextlib.nullcontext(StandIn(answers)))
        monkeypatch.setattr(moves.time, "sleep", lambda s: None)
    return use


PROGRESS = [answer("starting"), answer("sleeping"), answer("copying", 0, TOTAL), answer("copying", MB4, TOTAL),
            answer("copying", MB4, TOTAL), answer("copying", 2 * MB4, TOTAL), answer("copying", TOTAL, TOTAL),
            answer("waking", TOTAL, TOTAL), answer("done", TOTAL, TOTAL)]
LINES = ["move m1: job1 rack1 -> rack2", "starting", "sleeping", f"copying 0/{TOTAL} bytes",
         f"copying {MB4}/{TOTAL} bytes", f"copying {2 * MB4}/{TOTAL} bytes", f"copying {TOTAL}/{TOTAL} bytes",
         "waking", "done"]


def test_on_a_pipe_each_change_of_progress_is_one_plain_line(stand_in, capsys):
    stand_in(PROGRESS)
    moves.move("job1", to="rack2", host=None, wait=True, json_=False)
    out = capsys.readouterr().out.splitlines()
    assert out[:len(LINES)] == LINES and "done" in out[-2]


def test_under_json_the_progress_goes_to_stderr(stand_in, capsys):
    stand_in(PROGRESS)
    moves.move("job1", to="rack2", host=None, wait=True, json_=True)
    got = capsys.readouterr()
    assert json.loads(got.out)["state"] == "done" and got.err.splitlines() == LINES


def test_a_failed_move_prints_its_reason_and_exits_1(stand_in, capsys):
    stand_in([answer("starting"), answer("copying", MB4, TOTAL), answer("failed", MB4, TOTAL, "target gone")])
    with pytest.raises(moves.typer.Exit) as exit_:
        moves.move("job1", to="rack2", host=None, wait=True, json_=False)
    assert exit_.value.exit_code == 1 and "failed: target gone" in capsys.readouterr().out.splitlines()


class LostStandIn(StandIn):
    """As StandIn, then the controller stops answering (the SDK's "unreachable")."""

    def get(self, move_id):
        if not self.answers:
            raise ApiError(0, "unreachable", "cannot reach the controller at unix:///gone.sock")
        return super().get(move_id)


def test_under_json_an_error_while_waiting_is_the_api_error_body_after_the_progress(monkeypatch, capsys):
    lost = LostStandIn([answer("starting"), answer("sleeping")])
    monkeypatch.setattr(controller, "client", lambda: contextlib.nullcontext(lost))
    monkeypatch.setattr(moves.time, "sleep", lambda s: None)
    with pytest.raises(moves.typer.Exit) as exit_:
        moves.move("job1", to="rack2", host=None, wait=True, json_=True)
    got = capsys.readouterr()
    *progress, last = got.err.splitlines()
    assert exit_.value.exit_code == 1 and got.out == "" and progress == LINES[:3]
    assert json.loads(last) == {"error": {"code": "unreachable",
                                          "message": "cannot reach the controller at unix:///gone.sock"}}


class InterruptedStandIn(StandIn):
    """As StandIn, then the operator presses Ctrl-C while the command waits."""

    def get(self, move_id):
        if not self.answers:
            raise KeyboardInterrupt
        return super().get(move_id)


def test_ctrl_c_while_waiting_says_the_move_goes_on(monkeypatch, capsys):
    monkeypatch.setattr(controller, "client",
                        lambda: contextlib.nullcontext(InterruptedStandIn([answer("starting"), answer("sleeping")])))
    monkeypatch.setattr(moves.time, "sleep", lambda s: None)
    with pytest.raises(moves.typer.Exit) as exit_:
        moves.move("job1", to="rack2", host=None, wait=True, json_=False)
    err = capsys.readouterr().err
    assert exit_.value.exit_code == 130
    assert "move m1 goes on" in err and "fuse controller moves m1" in err
