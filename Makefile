# The two quick-start commands: `make example` and `make test`.
# Each one creates .venv (with the interpreter named by PYTHON) when needed,
# installs the package with its dev extras, then runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: example test test-all ready lint typecheck bytecode bench clean java jars kafka cds kafka-faults

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

# Three workers on the 2 cores: one runs the heavy end-to-end stories in turn, one the lighter
# stories beside them, and every worker then takes the other files, a file at a time
# (conftest.py deals them); the stories wait on their containers, so a third worker fills
# what would be idle (docs/development.md, "How the suite runs"). `make test` is what CI
# runs: every spec but those marked `long` (stories proven again on a second input, further
# cases of a spec it runs), 14-20 minutes on 2 cores, longer on slow days (its limit is 15:
# docs/development.md, "Two tiers"); `make test-all` runs those too (about 90 minutes).
PYTEST := PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# What the specs need, made side by side once the venv is there: the linters and mypy read,
# mvn fetches, javac and the class-data archive run Java (a fresh clone's setup is CPU-bound
# on 2 cores as the suite is, so they overlap each other's waits).
ready: lint typecheck bytecode java jars cds

# The package's and the specs' bytecode, compiled once: pip compiles what it installs, but not
# an editable install's source, and where PYTHONDONTWRITEBYTECODE is set (as on CI's machine)
# every process the suite starts (containers, CLI commands, Spark's Python workers) would
# compile the modules it imports again (0.1 s or so a process).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q spark_elastic tests examples benchmarks udfs conftest.py

test:
	@$(MAKE) --no-print-directory $(STAMP)
	@$(MAKE) --no-print-directory -j 4 --output-sync=target ready
	$(PYTEST) -m "not long"

test-all:
	@$(MAKE) --no-print-directory $(STAMP)
	@$(MAKE) --no-print-directory -j 4 --output-sync=target ready
	$(PYTEST)

# The seeded fault test on Kafka, its long schedules, for the seeds named:
# make kafka-faults SEEDS="1 2 3" (each prints its schedule; a failing seed fails the run).
SEEDS ?= 1
kafka-faults:
	@$(MAKE) --no-print-directory $(STAMP)
	@$(MAKE) --no-print-directory -j 4 --output-sync=target jars cds bytecode
	SPARK_ELASTIC_FAULT_SEEDS="$(SEEDS)" PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python -m pytest -s tests/runtime/test_kafka_faults.py -k long_schedule

# A class-data archive of Spark's classes for the Spark applications the specs start (they
# start about twice as fast with it): made once per java and pyspark, in .cache/cds.
cds: $(STAMP) java
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python tests/cds.py

# Jars from Maven Central, fetched once into .cache/jars (see maven/*/pom.xml): an Apache
# Kafka broker (kafka/), Spark's Kafka connector without what pyspark ships (spark-kafka/),
# a MiniDFSCluster (hdfs/), an S3 server (s3proxy/), Hadoop's S3A client (s3a/) and a
# Kubernetes API server (k8s-mock/: fabric8's mock server in CRUD mode).
JARS       := .cache/jars
JARS_STAMP := $(JARS)/.fetched
# What pyspark's jars/ already holds, left out of the S3A client's jars.
PYSPARK_HAS := io.netty,org.slf4j,commons-codec,commons-logging,org.apache.httpcomponents

$(JARS_STAMP): maven/kafka/pom.xml maven/spark-kafka/pom.xml maven/hdfs/pom.xml maven/s3proxy/pom.xml maven/s3a/pom.xml maven/k8s-mock/pom.xml
	@command -v java >/dev/null 2>&1 || { echo "spark-elastic: 'make jars' needs Java 17 and 'java' was not found on PATH; install a JDK 17 (e.g. 'apt-get install openjdk-17-jdk-headless') and retry" >&2; exit 1; }
	@command -v mvn >/dev/null 2>&1 || { echo "spark-elastic: 'make jars' fetches jars from Maven Central with Maven and 'mvn' was not found on PATH; install it (e.g. 'apt-get install maven') and retry" >&2; exit 1; }
	rm -rf $(JARS)/kafka $(JARS)/spark-kafka $(JARS)/hdfs $(JARS)/s3proxy $(JARS)/s3a $(JARS)/k8s-mock
	mvn -q -B -f maven/kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath $(JARS)/kafka)
	mvn -q -B -f maven/spark-kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath $(JARS)/spark-kafka)
	mvn -q -B -f maven/hdfs/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath $(JARS)/hdfs)
	mvn -q -B -f maven/s3proxy/pom.xml dependency:copy -DoutputDirectory=$(abspath $(JARS)/s3proxy)
	mvn -q -B -f maven/s3a/pom.xml dependency:copy-dependencies -DexcludeGroupIds=$(PYSPARK_HAS) -DoutputDirectory=$(abspath $(JARS)/s3a)
	mvn -q -B -f maven/k8s-mock/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath $(JARS)/k8s-mock)
	@touch $@

# spark-elastic's own jars, compiled from java/ against pyspark's jars: the `gated-kafka`
# source (Spark's Kafka source held at a gate file) beside the connector's jars, and the S3
# checkpoint manager (a no-overwrite create is a conditional put) beside the S3A client's;
# and, against the mock server's jars, the main that starts it (java/.../k8smock).
GATED_JAR := $(JARS)/spark-kafka/spark-elastic-gated-kafka.jar
S3A_JAR   := $(JARS)/s3a/spark-elastic-s3a.jar
K8S_JAR   := $(JARS)/k8s-mock/spark-elastic-k8s-mock.jar
K8S_SRC   := $(shell find java/io/github/sparkelastic/k8smock -type f)
JAVA_SRC  := $(filter-out $(K8S_SRC),$(shell find java -type f))

$(GATED_JAR) $(S3A_JAR) &: $(JAVA_SRC) $(JARS_STAMP) $(STAMP)
	@command -v javac >/dev/null 2>&1 || { echo "spark-elastic: 'make jars' compiles java/ and 'javac' was not found on PATH; install a JDK 17 (e.g. 'apt-get install openjdk-17-jdk-headless') and retry" >&2; exit 1; }
	rm -rf build/java && mkdir -p build/java
	javac -Xlint:all,-path -Werror --release 17 -d build/java \
		-cp "$$($(BIN)/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')/*" \
		$(filter %.java,$(JAVA_SRC))
	cp -r java/META-INF build/java/
	jar cf $(GATED_JAR) -C build/java META-INF -C build/java io/github/sparkelastic/kafka
	jar cf $(S3A_JAR) -C build/java io/github/sparkelastic/s3a

$(K8S_JAR): $(K8S_SRC) $(JARS_STAMP)
	@command -v javac >/dev/null 2>&1 || { echo "spark-elastic: 'make jars' compiles java/ and 'javac' was not found on PATH; install a JDK 17 (e.g. 'apt-get install openjdk-17-jdk-headless') and retry" >&2; exit 1; }
	rm -rf build/k8s-mock && mkdir -p build/k8s-mock
	javac -Xlint:all,-path,-processing -Werror --release 17 -d build/k8s-mock \
		-cp "$(JARS)/k8s-mock/*" $(K8S_SRC)
	jar cf $(K8S_JAR) -C build/k8s-mock io/github/sparkelastic/k8smock

jars: $(JARS_STAMP) $(GATED_JAR) $(S3A_JAR) $(K8S_JAR)

# A Kafka broker on 127.0.0.1:$(KAFKA_PORT) (0: a free port) for trying the project; Ctrl-C stops it.
KAFKA_PORT ?= 9092
kafka: $(STAMP) jars
	$(BIN)/python tests/kafka_jvm.py --port $(KAFKA_PORT)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
