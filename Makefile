# The two commands a new user needs: `make run` and `make test`. Both start from a bare Debian
# machine with python3, make and apt, and install everything else themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= kittiwake.toml
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test venv test-deps build-deps system-deps browser-deps java lint typecheck bench bench-jms bench-spark demo clean

$(BIN)/python:
	@$(PYTHON) -c 'import venv' 2>/dev/null && $(PYTHON) -m venv $(VENV) 2>/dev/null || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python build-deps
	$(BIN)/python -m pip install -q -e .

# python-qpid-proton is built from source where no wheel fits: a C compiler and Python's headers.
build-deps:
	@command -v cc >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q build-essential python3-dev; }

RHEA_DIR := tests/integration/amqp/rhea

test-deps: $(BIN)/python build-deps system-deps
	$(BIN)/python -m pip install -q -e '.[test]'
	cd $(RHEA_DIR) && npm ci --no-audit --no-fund --silent

# Debian packages the tests talk to: mosquitto_pub/mosquitto_sub are real third-party clients;
# node and npm run rhea, a second AMQP 1.0 client; Java runs the real Spark the data source's
# tests use.
system-deps: java
	@command -v mosquitto_sub >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q mosquitto-clients; }
	@command -v npm >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q nodejs npm; }

# The browser test of MQTT over WebSockets: Debian's Chromium (headless) and MQTT.js from npm,
# pinned by tests/browser/package-lock.json.
# Only what is missing is installed: where Node.js comes from NodeSource its npm is inside it, and
# Debian's npm package would conflict with it.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }
	@command -v npm >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q nodejs npm; }
	@[ -f tests/browser/node_modules/mqtt/dist/mqtt.min.js ] || \
	  npm ci --prefix tests/browser --no-audit --no-fund

# Spark 4 needs Java 17 or newer: checked with `java -version`, Debian's JRE 17 installed when
# it is missing or older (the distribution's default JRE where 17 is not packaged).
java:
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\).*/\1/p' | head -n 1); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then \
	  echo "Java 17 or newer not found (java -version: $${v:-none}); installing it"; \
	  $(SUDO) apt-get update -q && \
	  { $(SUDO) apt-get install -y -q openjdk-17-jre-headless || \
	    $(SUDO) apt-get install -y -q default-jre-headless; }; \
	fi

run: venv
	$(BIN)/kittiwake serve $(if $(wildcard $(CONFIG)),--config $(CONFIG),)

# TEST_WORKERS=0 runs the suite in one process (tests/conftest.py says how it is spread).
TEST_WORKERS ?= 2
test: test-deps browser-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

lint: test-deps
	$(BIN)/ruff check src tests examples
	$(BIN)/mypy --strict src/kittiwake

# Side-by-side benchmark against mosquitto and amqtt (not part of the tests). BENCH_ARGS=--smoke
# for a quick run.
bench: venv
	bash bench/setup_peers.sh
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The four JMS scenarios against ActiveMQ 5.17 in the same run (kittiwake through proton's
# client and kittiwake.jms, ActiveMQ through its OpenWire JMS client). BENCH_ARGS=--smoke.
bench-jms: venv
	bash bench/setup_peers.sh --with-activemq
	$(BIN)/python bench/run_jms.py $(BENCH_ARGS)

# The Spark data source's read throughput over Flight (batch and stream, local[2]), and the
# end-to-end exactly-once pipeline (read, transform, write back).
bench-spark: test-deps
	$(BIN)/python bench/bench_spark_read.py $(BENCH_ARGS)
	$(BIN)/python bench/bench_spark_pipeline.py $(BENCH_ARGS)

# The data pipeline users run: broker, simulated sensors over MQTT, a Structured Streaming job
# writing stats/<device> (retained) and alerts/<device> back, mosquitto_sub watching; for
# DEMO_SECONDS (default 60) with DEMO_DEVICES (default 300).
DEMO_SECONDS ?= 60
DEMO_DEVICES ?= 300
demo: $(BIN)/python build-deps system-deps
	$(BIN)/python -m pip install -q -e '.[demo]'
	DEMO_SECONDS=$(DEMO_SECONDS) DEMO_DEVICES=$(DEMO_DEVICES) $(BIN)/python examples/demo.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache
