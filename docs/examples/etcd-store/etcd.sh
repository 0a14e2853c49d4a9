#!/bin/sh
# One etcd member on this host, its data in a fresh temporary folder removed at exit.
set -eu
data=$(mktemp -d /tmp/etcd-example.XXXXXX)
etcd --name store --data-dir "$data" \
    --listen-client-urls http://0.0.0.0:2379 --advertise-client-urls "http://$(hostname):2379" \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster store=http://127.0.0.1:2380 --log-level warn &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" || true; rm -rf "$data"; exit 0' TERM INT
wait "$pid"
status=$?
rm -rf "$data"
exit "$status"
