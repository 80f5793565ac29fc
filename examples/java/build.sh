#!/usr/bin/env bash
# Build the Java example with Maven (pom.xml: Java code generated from
# protos/tidelog/v1 by protoc and protoc-gen-grpc-java from Maven Central, not
# committed). Skips Maven when the jar is newer than every input, so a run
# with nothing changed costs no JVM start; ~/.m2 caches what Maven fetched.
# Usage: examples/java/build.sh   (prints the jar's path)
# Exits 3 with a message on stderr when java or mvn is not installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in java mvn; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "java example: '$tool' is not installed (needed to build and run the Java example)" >&2
    exit 3
  fi
done
jar=examples/java/target/tidelog-java-example.jar
if [ -f "$jar" ] && [ -z "$(find examples/java/pom.xml examples/java/src protos/tidelog/v1 -newer "$jar" -type f | head -1)" ]; then
  realpath "$jar"
  exit 0
fi
(cd examples/java && mvn -B -q package >&2)
realpath "$jar"
