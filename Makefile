# The two commands: `make demo` (the daily pipeline end to end through Airflow) and `make test`.
# Both bootstrap a fresh machine (venv, pinned packages, Delta jars, report assets) and are safe to rerun.

SHELL := /bin/bash
PYTHON_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
CACHE := .cache
PKG_STAMP := $(VENV)/.installed
JARS_STAMP := $(CACHE)/jars/.complete
ASSETS_STAMP := $(CACHE)/dq_assets/.complete
# The JVM class archive local Spark sessions start from (gem/lakehouse/spark.py: each job starts faster).
CLASS_ARCHIVE := $(CACHE)/spark-classes.jsa
# Hadoop's local file system without a forked chmod per file written (infra/spark/localfs).
LOCAL_FS_JAR := $(CACHE)/gem-localfs.jar
# The cluster demo's JVM class archives (drivers', executors'), made once: a stamp beside them.
CLUSTER_ARCHIVES := $(CACHE)/cluster-class-archives.stamp
# Optional: PyTorch's CPU wheel index, to install the small CPU-only torch build (see README).
TORCH_INDEX_URL ?=

.PHONY: setup browser services demo cluster-demo test test-slow test-all bench clean-data

setup: $(PKG_STAMP) $(JARS_STAMP) $(ASSETS_STAMP) $(LOCAL_FS_JAR) $(CLASS_ARCHIVE) $(CLUSTER_ARCHIVES)

$(PKG_STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@command -v $(PYTHON_BOOT) >/dev/null || { echo "need $(PYTHON_BOOT) on PATH"; exit 1; }
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==26.3
	@if [ -n "$(TORCH_INDEX_URL)" ]; then \
	  $(PY) -m pip install --quiet "torch==$$(sed -n 's/^torch==//p' requirements.txt)" --index-url "$(TORCH_INDEX_URL)"; fi
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	# This repo itself, editable: the `gem` command (pyproject's console script) in $(VENV)/bin.
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	bash infra/pip_check.sh $(PY)
	@touch $@

$(JARS_STAMP): infra/delta-jars/pom.xml
	@command -v mvn >/dev/null || { echo "need Maven (mvn) to fetch the Delta jars once"; exit 1; }
	rm -rf $(CACHE)/jars $(CACHE)/jars.tmp
	mvn -q -B -f infra/delta-jars/pom.xml dependency:copy-dependencies \
	  -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/$(CACHE)/jars.tmp
	mv $(CACHE)/jars.tmp $(CACHE)/jars && touch $@

# Compiled against the Hadoop API jar Maven fetched; javac comes with the JDK Spark runs on.
$(LOCAL_FS_JAR): infra/spark/localfs/gem/hadoop/NioLocalFileSystem.java $(JARS_STAMP)
	@command -v javac >/dev/null || { echo "need a JDK (javac) to build $@"; exit 1; }
	rm -rf $(CACHE)/localfs.tmp && mkdir -p $(CACHE)/localfs.tmp
	javac --release 17 -cp "$$(ls $(CACHE)/jars/hadoop-client-api-*.jar | head -1)" -d $(CACHE)/localfs.tmp $<
	jar cf $@.tmp -C $(CACHE)/localfs.tmp . && mv $@.tmp $@ && rm -rf $(CACHE)/localfs.tmp

# Spark's own start-up warnings go to a log (shown only if archiving fails). Made with the local
# file system jar on the class path: an archive is used only by JVMs started with its class path.
$(CLASS_ARCHIVE): $(PKG_STAMP) $(JARS_STAMP) $(LOCAL_FS_JAR)
	$(PY) -m gem.lakehouse.spark archive-classes > $(CACHE)/archive-classes.log 2>&1 \
	  || { cat $(CACHE)/archive-classes.log; exit 1; }
	@echo "class archive: $@ (Spark's log: $(CACHE)/archive-classes.log)"

# Made on a local-cluster master (no service started); `make cluster-demo` makes them itself where
# they are missing or its config's JVM options differ (gem.lakehouse.spark.cluster_class_archives).
$(CLUSTER_ARCHIVES): $(PKG_STAMP) $(JARS_STAMP)
	$(PY) -m gem.pipeline.cluster_demo --class-archives-only > $(CACHE)/cluster-class-archives.log 2>&1 \
	  || { cat $(CACHE)/cluster-class-archives.log; exit 1; }
	@touch $@ && tail -1 $(CACHE)/cluster-class-archives.log

$(ASSETS_STAMP): $(PKG_STAMP) infra/dq_assets/assets.txt infra/dq_assets/fetch.sh
	bash infra/dq_assets/fetch.sh $(CACHE)/dq_assets

demo: setup
	$(PY) -m gem.pipeline.demo $(if $(CONFIG),--config $(CONFIG),)

# The demo's days on the local cluster topology: an S3 API server holding the lakehouse and a Spark
# master with two workers (gem/pipeline/cluster_demo.py; docs/cluster.md). Stops all it started.
cluster-demo: setup services
	$(PY) -m gem.pipeline.cluster_demo $(if $(CONFIG),--config $(CONFIG),)

# `make test`: every test not marked slow (the quick tier; CI runs it). `make test-slow`:
# the slow tier (end-to-end Airflow runs with the real scheduler, the learning claims, crash and
# concurrency tests with real processes; much longer). `make test-all`: both.
# Chromium for the browser tests of the HTML reports (installed when missing and root can: infra/chromium.sh).
browser:
	@bash infra/chromium.sh $(PY)

# Redis and PostgreSQL for the Airflow cluster (Celery's broker, the metadata DB) of the slow tests and
# cluster-demo: Debian's packages, installed when missing and root can (infra/cluster_services.sh).
services:
	@bash infra/cluster_services.sh

# The quick tier on TEST_WORKERS pytest-xdist workers, each test file whole on one worker (its module
# fixtures built once): much of a test's time is a JVM, an Airflow process or a subprocess waiting,
# which the other worker fills. TEST_WORKERS=0 runs it in one process.
# Each worker's torch runs one thread (OMP_NUM_THREADS, inherited by the processes tests start): with
# torch's default of a thread per core, two workers training at once run twice as many OpenMP threads
# as cores, and those threads spin waiting for descheduled partners.
TEST_WORKERS ?= 2
test: setup browser services
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: setup browser services
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

test-all: setup browser services
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) -m bench.ingest_throughput
	$(PY) -m bench.silver_incremental
	$(PY) -m bench.loader_throughput

clean-data:
	rm -rf lakehouse .airflow
