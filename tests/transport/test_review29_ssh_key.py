"""Twenty-ninth session: FUSE_SSH_KEY naming a public key (the ``.pub`` beside the
private one, a common slip) was "cannot be used without a prompt: Invalid private key",
a sentence about prompts where none is involved (review). An encrypted key keeps its
own sentence."""

from __future__ import annotations

import subprocess

import pytest

from fuse.errors import NotTrusted
from fuse.transport.ssh import SshOptions, SshTarget, _connect


async def _refusal(sshd, key) -> str:
    o = SshOptions(key=str(key), known_hosts=str(sshd.known_hosts), relay="true", connect_timeout=10)
    with pytest.raises(NotTrusted) as e:
        await _connect(SshTarget("root", "127.0.0.1", sshd.port), o, 10)
    return e.value.message


async def test_a_public_key_given_as_the_ssh_key_is_named_as_such(sshd, tmp_path):
    pub = sshd.key.with_suffix(".pub")
    msg = await _refusal(sshd, pub)
    assert f"the SSH key {pub} is not a private key fuse can read" in msg, msg
    assert f"give the private key, {sshd.key}" in msg and "prompt" not in msg, msg
    # an encrypted private key is still about the prompt it would need
    enc = tmp_path / "enc_key"
    enc.write_bytes(sshd.key.read_bytes())
    enc.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "secret", "-f", str(enc)], check=True, timeout=30)
    msg = await _refusal(sshd, enc)
    assert "cannot be used without a prompt" in msg, msg
