#!/bin/sh
# What this example needs on the machine that runs it (as root): redis-server from
# Debian and the redis client from PyPI for the python3 the campaign's programs run.
set -eu
if ! command -v redis-server >/dev/null 2>&1; then
    apt-get install -y redis-server
fi
python3 -c 'import redis' 2>/dev/null || python3 -m pip install 'redis>=5'
redis-server --version
python3 -c 'import redis; print("redis-py", redis.__version__)'
