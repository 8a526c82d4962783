# Two entry points (see README): `make demo` and `make test`. Both work on a fresh
# Debian machine: they create .venv and install what they need.
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the tests drive for real: Prometheus (scrape), stunnel (TLS broker),
# Java and Maven (Apache Kafka from Maven Central, tools/fetch-apache-kafka).
TEST_TOOLS := prometheus stunnel4 default-jre-headless maven

.PHONY: demo test test-tools test-apache-kafka apache-kafka lint bench

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/kafka-admission-proxy demo

test-tools:
	@missing=""; for t in prometheus promtool stunnel4 java mvn; do command -v $$t >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEST_TOOLS); \
	fi

# Apache Kafka's broker, Java client tools and Kroxylicious into .cache/apache-kafka (once).
apache-kafka: test-tools
	tools/fetch-apache-kafka >/dev/null

test: $(BIN)/.installed test-tools apache-kafka
	$(BIN)/ruff check .
	$(BIN)/mypy policies proxy
	$(BIN)/pytest

# Only the tests against Apache Kafka itself (tests/apache_kafka).
test-apache-kafka: $(BIN)/.installed apache-kafka
	$(BIN)/pytest -m apache_kafka

bench: $(BIN)/.installed
	$(BIN)/python bench/proxy_vs_direct.py
