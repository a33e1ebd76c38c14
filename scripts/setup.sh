#!/usr/bin/env bash
# Installs everything Eventfold needs on a Debian 12 machine: apt packages
# (PostgreSQL server, Java 17, Maven), the local stack's jars from Maven Central
# (Apache Kafka, Kafka Connect, Debezium: local_stack/pom.xml, into
# local_stack/jars) and a virtualenv at .venv with the project and its dev and
# bench extras. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# wrk drives bench/read_api.py; Chromium and its driver, the dashboard's browser test
apt_packages=(postgresql postgresql-contrib openjdk-17-jre-headless wrk chromium chromium-driver)
command -v mvn >/dev/null || apt_packages+=(maven)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing apt packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# A jars directory is complete when its marker holds the SHA-256 of the pom it was filled
# from (local_stack/java.py's pom_digest writes the same).
fetch_jars() {  # pom, directory, what
  local pinned
  pinned=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$(cat "$2/.complete" 2>/dev/null)" != "$pinned" ]; then
    echo "setup: fetching $3 ($1)"
    rm -rf "$2"
    mvn -q -B -f "$1" dependency:copy-dependencies -DoutputDirectory="$PWD/$2" \
      -DincludeScope=runtime
    echo "$pinned" > "$2/.complete"
  fi
}
fetch_jars local_stack/pom.xml local_stack/jars "the Kafka, Kafka Connect and Debezium jars"

python_bin="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python_bin" -m venv .venv
fi
if ! .venv/bin/python -c "import eventfold, pyspark, confluent_kafka, eventsourcing" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.installed ]; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/pip install -q -U pip
  .venv/bin/pip install -q -e ".[dev,bench]"
  touch .venv/.installed
fi
# The JVMs' class-data archives (broker, Connect, the local Spark driver): recorded once,
# so that every later start maps its classes instead of loading them again.
.venv/bin/python -m eventfold.cli stack install | sed -n 's/^class-data/setup: class-data/p'
echo "setup: ready ($(.venv/bin/python --version), $(java -version 2>&1 | head -1))"
