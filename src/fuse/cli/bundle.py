"""`fuse bundle ...`: build and list guest bundles (kernel + initramfs)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Optional

import typer

from .output import emit_json, fail, table

app = typer.Typer(help="Build and list guest bundles.", no_args_is_help=True)


def _state_dir(state_dir: Optional[Path]) -> Path:
    from .host import default_state_dir
    return state_dir or default_state_dir()


@app.command()
def build(
    name: str = typer.Option("linux", help="Bundle name, as VM names: a-z, 0-9, _ . - (VMs ask for it by name)."),
    state_dir: Optional[Path] = typer.Option(None, help="The host agent's state dir."),
    cache_dir: Optional[Path] = typer.Option(None, help="Where the kernel .deb is kept (default: STATE/cache)."),
    kernel_deb: Optional[Path] = typer.Option(None, help="Use this linux-image .deb instead of apt-get download."),
    json_: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Assemble a bundle from Debian's kernel and busybox-static; the same
    inputs always give the same fingerprint.

    A --name that is not a bundle name (VM names' pattern: a-z, 0-9, '_', '.',
    '-') is invalid_argument, exit 2, before anything is fetched; so is a
    --kernel-deb that holds no kernel it can boot (no /boot/vmlinuz-*, not an
    xz-compressed one); a file that cannot be read or written is io_error, exit 1."""
    from ..agent.bundle import build_bundle, name_problem
    from ..errors import FuseError

    if why := name_problem(name):
        fail("invalid_argument", f"--name: {why}", json_=json_, exit_code=2)
    state = _state_dir(state_dir)
    say = (lambda msg: typer.echo(msg, err=True)) if json_ else typer.echo
    try:
        manifest = build_bundle(state, name, cache_dir=cache_dir, kernel_deb=kernel_deb, progress=say)
    except FuseError as exc:
        fail(exc.code, exc.message, json_=json_, exit_code=2 if exc.http_status == 400 else 1)
    except OSError as exc:
        fail("io_error", str(exc), json_=json_)
    except RuntimeError as exc:  # a kernel package or image it cannot use: said in one line
        if kernel_deb is not None:
            fail("invalid_argument", f"--kernel-deb {kernel_deb}: {exc}", json_=json_, exit_code=2)
        fail("io_error", str(exc), json_=json_)
    except subprocess.CalledProcessError as exc:  # a tool it runs said no: its own last line says why
        why = _last_line(exc.stderr) or f"{exc.cmd[0]} exited {exc.returncode}"
        if kernel_deb is not None and exc.cmd[0] == "dpkg-deb":  # (random bytes, a text file: no .deb at all)
            fail("invalid_argument", f"--kernel-deb {kernel_deb}: not a Debian package ({why})",
                 json_=json_, exit_code=2)
        fail("io_error", f"{' '.join(map(str, exc.cmd))}: {why}", json_=json_)
    if json_:
        emit_json(manifest)


def _last_line(output: bytes | str | None) -> str:
    """The last non-blank line a tool wrote (on stderr, where it says what went wrong), or ""."""
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    lines = [ln.strip() for ln in (output or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@app.command("list")
def list_(state_dir: Optional[Path] = typer.Option(None), json_: bool = typer.Option(False, "--json")) -> None:
    """The bundles this host has."""
    from ..agent.bundle import list_bundles

    state = _state_dir(state_dir)
    # a dir not made yet has no bundles; one under a regular file is a mistake to say
    there = next((p for p in (state, *state.absolute().parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        from .host import state_dir_problem
        fail("io_error", state_dir_problem(state, NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                                                                     str(there))), json_=json_)
    rows = list_bundles(state)
    if json_:
        emit_json(rows)
    else:
        table(["name", "kernel", "fingerprint"], [(b["name"], b["kernel"], b["fingerprint"]) for b in rows],
              title="bundles")
