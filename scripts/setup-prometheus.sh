#!/usr/bin/env bash
# A real Prometheus for the metrics tests: Debian's `prometheus` package (2.42 on bookworm), whose
# server and promtool the tests start themselves on loopback with a generated configuration.
# Idempotent; the tests use the binaries only (never the package's service). Needs root for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-prometheus: need root to install prometheus (apt-get); the Prometheus tests will skip" >&2
    exit 0
  fi
  echo "setup-prometheus: installing prometheus" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The tests start their own server on a free loopback port, whatever the package's unit does.
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

echo "setup-prometheus: $(prometheus --version 2>&1 | head -n1)" >&2
