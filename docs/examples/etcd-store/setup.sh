#!/bin/sh
# What this example needs on the machine that runs it (as root): etcd from Debian.
# The programs use only Python's standard library (etcd's HTTP/JSON gateway).
set -eu
if ! command -v etcd >/dev/null 2>&1; then
    apt-get install -y etcd-server etcd-client
fi
etcd --version
