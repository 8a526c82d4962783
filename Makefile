# Two entry points (see README): `make demo` and `make test`. Both work on a fresh
# Debian machine: they create .venv and install what they need.
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests drive for real: Prometheus (scrape), stunnel (TLS broker),
# Chromium and its WebDriver (report.html opened in a headless browser).
TEST_TOOLS := prometheus stunnel4 chromium chromium-driver

.PHONY: demo test test-tools lint bench bench-report

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,pipeline]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/kafka-admission-proxy demo

test-tools:
	@missing=""; for t in prometheus promtool stunnel4 chromium chromedriver; do command -v $$t >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEST_TOOLS); \
	fi
	@# Spark (tests/pipeline, `report`) needs a Java runtime: Java 17 is on these machines; install one only if missing.
	@command -v java >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends default-jre-headless; }

test: $(BIN)/.installed test-tools
	$(BIN)/ruff check .
	$(BIN)/mypy policies proxy
	$(BIN)/mypy --strict pipeline
	$(BIN)/pytest

bench: $(BIN)/.installed
	$(BIN)/python bench/proxy_vs_direct.py

# `report` timed on 10 million synthetic audit events, JSON lines and Parquet (bench/report_bench.py)
bench-report: $(BIN)/.installed
	$(BIN)/python bench/report_bench.py
