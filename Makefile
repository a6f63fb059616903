# The two quick-start commands: `make example` and `make test`.
# Each one creates .venv (with the interpreter named by PYTHON) when needed,
# installs the package with its dev extras, then runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: example test lint typecheck bench clean java

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

java:
	@command -v java >/dev/null 2>&1 || { echo "spark-elastic: Java 17 is required for Spark but 'java' was not found on PATH; install a JDK 17 (e.g. 'apt-get install openjdk-17-jre-headless') and retry" >&2; exit 1; }

example: $(STAMP) java
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python examples/clickstream.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers, a file each at a time, the end-to-end files first (conftest.py orders them).
test: lint typecheck java
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
