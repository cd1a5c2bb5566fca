# Two commands: `make run` (set up and start the service) and `make test` (set up and run all tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two distributions, both installed editable: the client (client/packaging) and the server
# (the repository root). `make run` installs what the server needs; `make test` adds the dev tools.
SERVER := $(VENV)/.server-installed
DEV := $(VENV)/.dev-installed
PIP := $(BIN)/pip install --quiet --disable-pip-version-check

.PHONY: setup run test test-fast test-long lint typecheck clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(SERVER): pyproject.toml client/packaging/pyproject.toml | $(VENV)/bin/python
	$(PIP) -e ./client/packaging -e .
	touch $@

$(DEV): pyproject.toml client/packaging/pyproject.toml | $(VENV)/bin/python
	$(PIP) -e "./client/packaging[spark]" -e ".[dev]"
	touch $(SERVER) $@

setup: $(DEV)

run: $(SERVER)
	$(BIN)/python -m statehouse.app.serve --host $${STATEHOUSE_HOST:-127.0.0.1} --port $${STATEHOUSE_PORT:-8000}

# Two pytest-xdist workers (the 2-core CI machine): the Spark tests on one, the other files spread
# over both (tests/conftest.py). Serially: make test WORKERS=0.
WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup
# Where PYTHONDONTWRITEBYTECODE is set (machines of this kind set it), every server a test starts would
# compile the checkout's modules again, a quarter of a second of CPU each time: compile them once.
BYTECODE := $(BIN)/python -m compileall -q -j 0 -x '/(build|\.venv)/' app backends snapshots protocol client tests bench
# Likewise Spark's class archive (tests/support/spark.py), made once per venv: the Spark tests' JVMs
# start twice as fast with it.
SPARK_ARCHIVE := $(BIN)/python -m tests.support.spark

# Everything but the `long` runs (markers in pyproject.toml): those are make test-long.
test: $(DEV)
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck
	$(BYTECODE)
	$(SPARK_ARCHIVE)
	$(PYTEST) -m "not long"

# For iteration: no Spark, no browser, none of the slow tests.
test-fast: $(DEV)
	$(BYTECODE)
	$(PYTEST) -m "not spark and not slow and not browser and not long"

test-long: $(DEV)
	$(BYTECODE)
	$(SPARK_ARCHIVE)
	$(PYTEST) -m long

lint: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Type-checked: every product folder.
FOLDERS := protocol snapshots backends app client
TYPED := $(addprefix statehouse.,$(FOLDERS))
typecheck: $(DEV)
	@rm -rf $(VENV)/typecheck/statehouse && mkdir -p $(VENV)/typecheck/statehouse
	@for d in $(FOLDERS); do ln -sfn "$(CURDIR)/$$d" $(VENV)/typecheck/statehouse/$$d; done
	MYPYPATH=$(VENV)/typecheck:$(CURDIR)/client/packaging $(BIN)/mypy $(addprefix -p ,$(TYPED))

# Regenerate tests/vectors/flink-vectors.json.gz from Flink's own classes (docs/state-model.md,
# "Checked against Flink itself"): Java 17 and Flink's jars (~300 MB, kept outside the repo).
FLINK_LIBS ?= /tmp/flinklibs
.PHONY: flink-vectors
flink-vectors: $(DEV)
	test -d $(FLINK_LIBS)/pyflink/lib || $(PIP) --no-deps --target $(FLINK_LIBS) apache-flink-libraries==2.3.0
	$(BIN)/python -m tests.support.flink_vectors --lib $(FLINK_LIBS)/pyflink/lib

clean:
	rm -rf $(VENV) data checkpoints .pytest_cache .ruff_cache
