# Two entry points (see README): `make demo` and `make test`. Both work on a fresh
# Debian machine: they create .venv and install what they need.
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests drive for real: Prometheus (scrape), stunnel (TLS broker),
# openssl (s_client/s_server for the TLS version tests).
TEST_TOOLS := prometheus stunnel4 openssl

.PHONY: demo test test-tools lint bench fuzz

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/kafka-admission-proxy demo

test-tools:
	@missing=""; for t in prometheus promtool stunnel4 openssl; do command -v $$t >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEST_TOOLS); \
	fi

test: $(BIN)/.installed test-tools
	$(BIN)/ruff check .
	$(BIN)/mypy policies proxy
	$(BIN)/pytest

bench: $(BIN)/.installed
	$(BIN)/python bench/proxy_vs_direct.py

# Over a million fuzz cases (the default suite runs a few thousand of the same targets);
# prints a table of cases and seconds per target and writes .fuzz-report.json.
fuzz: $(BIN)/.installed
	FUZZ_PROFILE=million $(BIN)/pytest tests/fuzz -p no:cacheprovider -q
