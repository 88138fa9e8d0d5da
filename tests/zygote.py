"""A fork server for the suite's `fuse` processes (``support._spawn``).

Each agent or controller a test starts is a real process running the real
command, ``python -m fuse.cli ARGS``, as before; only its imports are done once:
this process imports the servers' modules (FastAPI, pydantic models,
SQLAlchemy: most of a start's ~1 s of CPU) and forks a child per start, which
sets the start's environment, working dir, log and command line and runs the
CLI's entry; a start whose ``FUSE_*`` or ``PYTHON*`` variables differ from this
server's (read as modules load or the interpreter starts) execs a fresh
interpreter instead. The suite starts a thousand or so of them on a 2-core machine.

Protocol, one JSON object a line: on stdin ``{"args", "env", "log", "cwd", "umask"}``
(a start: the answer is ``{"pid", "start"}``, the start's number) or
``{"status": start}`` (the answer is ``{"code"}``: None while it runs, else as
``Popen.returncode``: −signal when a signal ended it). At end of input every
child still running is killed (the suite's processes must not outlive it)."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import sys
import traceback

PRELOAD = ("fuse.cli", "fuse.cli.main", "fuse.cli.host", "fuse.cli.controller", "fuse.cli.fleet",
           "fuse.controller.app", "fuse.controller.service", "fuse.agent.app", "fuse.serving",
           "fuse.agent.backends.qemu", "fuse.agent.probe", "uvicorn", "setproctitle")


START_ENV = dict(os.environ)


def _import_time(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(("FUSE_", "PYTHON"))}


def _preload() -> None:
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)


def _child(req: dict) -> None:
    """In the forked child: become ``python -m fuse.cli ARGS`` and run it; never returns."""
    code = 1
    try:
        # the title first: setproctitle writes over the process's original argv and environ
        # area, which it can find no more once the environment is replaced (it did nothing)
        from setproctitle import setproctitle
        setproctitle(" ".join([sys.executable, "-m", "fuse.cli", *req["args"]]))
        os.setsid()
        fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, 1024)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (as a fresh interpreter has them)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        os.umask(req["umask"])
        if _import_time(req["env"]) != _import_time(START_ENV):
            # fuse reads some settings as its modules load (FUSE_MOVE_IO_TIMEOUT...), and the
            # interpreter its PYTHON* ones as it starts: a start setting any of them otherwise
            # than this server's own env is a fresh interpreter, as without the fork server
            os.execve(sys.executable, [sys.executable, "-m", "fuse.cli", *req["args"]], req["env"])
        unbuffered = bool(req["env"].get("PYTHONUNBUFFERED"))
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True,
                                                       write_through=unbuffered)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), errors="backslashreplace",
                                                       line_buffering=True, write_through=True)
        import fuse.cli
        sys.argv = [os.path.join(os.path.dirname(fuse.cli.__file__), "__main__.py"), *req["args"]]
        sys.path[0] = os.getcwd()
        try:
            fuse.cli.entry()
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            traceback.print_exc()
            code = 130
        except BaseException:  # what python would print for an uncaught exception
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def main() -> None:
    _preload()
    # by start, not by pid: a pid is used again once its process is reaped, and a new child's
    # status read by pid answered the exit code of an old one (a start seen ended at once)
    codes: dict[int, int] = {}
    running: dict[int, int] = {}  # pid -> start number
    started = 0
    out = sys.stdout

    def reap() -> None:
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if (n := running.pop(pid, None)) is not None:
                codes[n] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.5)
        reap()
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            if "status" in req:
                reap()
                answer = {"code": codes.get(req["status"])}
            else:
                out.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(req)
                started += 1
                running[pid] = started
                answer = {"pid": pid, "start": started}
            out.write(json.dumps(answer) + "\n")
            out.flush()
    for pid in list(running):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
