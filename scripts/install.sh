#!/usr/bin/env bash
# Install what fuse and its tests need on a fresh Debian 12 machine (as root,
# or with sudo): QEMU and the guest-bundle tools, sshd for the SSH transport,
# PostgreSQL for the scale-out store, then fuse itself with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  qemu-system-x86 qemu-utils busybox-static cpio xz-utils \
  openssh-server openssh-client postgresql iproute2 procps git >/dev/null
python3 -m pip install -q --upgrade pip >/dev/null 2>&1 || true
python3 -m pip install -q -e '.[test,mlos]'
# The editable install leaves fuse's own modules uncompiled, and with
# PYTHONDONTWRITEBYTECODE set (as on these machines) every `fuse` process would
# compile them again: ~0.1 s of CPU each start (the tests start hundreds).
python3 -m compileall -q src >/dev/null
echo "fuse installed: $(command -v fuse)"
