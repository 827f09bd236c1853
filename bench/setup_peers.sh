#!/usr/bin/env bash
# Installs the peer brokers the benchmark compares Kittiwake with:
#   - Debian's mosquitto (apt package `mosquitto`; only the binary is used, the benchmark
#     starts it itself with a generated config on a loopback port);
#   - amqtt from PyPI, in its own venv bench/.venv-amqtt (never in the project's venv).
#   - with --with-profiler: py-spy in bench/.venv-tools, for `bench/run.py --profile`.
#   - with --with-activemq: Debian's activemq (5.17; only its jars and launcher are used, the
#     JMS benchmark bench/run_jms.py starts it itself with a generated config) and a JDK for
#     javac, which compiles the OpenWire client bench/jms/JmsBench.java at bench time.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
WITH_PROFILER=0
WITH_ACTIVEMQ=0
for arg in "$@"; do
  case "$arg" in
    --with-profiler) WITH_PROFILER=1 ;;
    --with-activemq) WITH_ACTIVEMQ=1 ;;
    *) echo "usage: $0 [--with-profiler] [--with-activemq]" >&2; exit 2 ;;
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
if [ "$WITH_ACTIVEMQ" = 1 ]; then
  if [ ! -f /usr/share/activemq/bin/activemq.jar ] || ! command -v javac >/dev/null 2>&1; then
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends activemq openjdk-17-jdk-headless
  fi
  # An instance Debian's service may have started is never the one the benchmark uses.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet activemq 2>/dev/null; then
    $SUDO systemctl stop activemq || true
  fi
  echo "activemq:  $(ls /usr/share/java/activemq-broker-*.jar 2>/dev/null | head -n 1)"
fi
echo "mosquitto: $(command -v mosquitto || echo /usr/sbin/mosquitto)"
echo "amqtt:     $PWD/$VENV/bin/amqtt ($("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("amqtt"))'))"
