#!/usr/bin/env bash
# Builds bench/projections.py's peers once (the README's two commands do not need them):
# the Kafka Streams application (Maven, Java 17, Apache Kafka 4.1.1 from Maven Central) and
# a virtualenv of its own for Quix Streams, which pins an older confluent-kafka than ours.
set -euo pipefail
cd "$(dirname "$0")"
mvn -q -f kafka_streams/pom.xml package dependency:copy-dependencies
python3 -m venv quix/.venv
quix/.venv/bin/pip install -q "quixstreams==3.28.1"
echo "peers: ready (Kafka Streams in kafka_streams/target, Quix Streams in quix/.venv)"
