# Two entry points (see README): `make demo` and `make test`. Both work on a fresh
# Debian machine: they create .venv and install what they need.
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests drive for real: Prometheus (scrape), stunnel (TLS broker).
TEST_TOOLS := prometheus stunnel4
# What the benchmarks compare against or count with: HAProxy and stunnel (baselines),
# valgrind (callgrind instruction counts), strace (system calls per request).
BENCH_TOOLS := haproxy stunnel4 valgrind strace
# e.g. make bench BENCH_ARGS="--paths floor,proxy-all --rounds 3"
BENCH_ARGS :=
PROFILE_ARGS :=

.PHONY: demo test test-tools lint bench bench-tools profile bench-instructions

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/kafka-admission-proxy demo

# Installs without starting or enabling the packages' services (see the script).
test-tools:
	tools/apt-install-no-services $(TEST_TOOLS)

test: $(BIN)/.installed test-tools
	$(BIN)/ruff check .
	$(BIN)/mypy policies proxy
	$(BIN)/pytest

bench-tools: $(BIN)/.installed
	tools/apt-install-no-services $(BENCH_TOOLS)

$(BIN)/py-spy: $(BIN)/.installed
	$(BIN)/pip install -q "py-spy==0.4.3"

# Every path of bench/README.md in one interleaved run; the issue 15 targets at the end.
bench: bench-tools
	$(BIN)/python bench/proxy_vs_direct.py $(BENCH_ARGS)

# py-spy profile of proxy-all (every policy on, audit on) under load, as bench/RESULTS.md shows it.
profile: bench-tools $(BIN)/py-spy
	$(BIN)/python bench/profile_proxy.py $(PROFILE_ARGS)

# Instructions per round trip (callgrind) of floor, epoll and proxy-all.
bench-instructions: bench-tools
	$(BIN)/python bench/instructions_per_request.py
