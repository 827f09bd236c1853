#!/usr/bin/env bash
# Installs the peer brokers the benchmark compares Kittiwake with:
#   - Debian's mosquitto (apt package `mosquitto`; only the binary is used, the benchmark
#     starts it itself with a generated config on a loopback port);
#   - amqtt from PyPI, in its own venv bench/.venv-amqtt (never in the project's venv).
#   - with --with-profiler: py-spy in bench/.venv-tools, for `bench/run.py --profile`.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
WITH_PROFILER=0
for arg in "$@"; do
  case "$arg" in
    --with-profiler) WITH_PROFILER=1 ;;
    *) echo "usage: $0 [--with-profiler]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends mosquitto
fi
# Debian's package enables a system service on port 1883; the benchmark never uses it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet mosquitto 2>/dev/null; then
  $SUDO systemctl stop mosquitto || true
fi

VENV=.venv-amqtt
if [ ! -x "$VENV/bin/amqtt" ]; then
  "$PYTHON" -m venv "$VENV" 2>/dev/null || {
    $SUDO apt-get update -q && $SUDO apt-get install -y -q python3-venv && "$PYTHON" -m venv "$VENV"; }
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "amqtt>=0.11"
fi
if [ "$WITH_PROFILER" = 1 ] && ! command -v py-spy >/dev/null 2>&1 && [ ! -x .venv-tools/bin/py-spy ]; then
  "$PYTHON" -m venv .venv-tools
  .venv-tools/bin/python -m pip install -q py-spy
fi
echo "mosquitto: $(command -v mosquitto || echo /usr/sbin/mosquitto)"
echo "amqtt:     $PWD/$VENV/bin/amqtt ($("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("amqtt"))'))"
