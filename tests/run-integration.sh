#!/usr/bin/env bash
# Integration tests against the real binary with real clients:
#   pytest suites (Debian's /usr/bin/python3: h2, grpcio, protobuf),
#   the official Connect client for Node (tests/node),
#   PID 1 / namespace tests (tests/ns, root only).
# Run from the repository root after `make asan` (make integration does both).
set -u
cd "$(dirname "$0")/.."
export CONCH_INIT_BIN=${CONCH_INIT_BIN:-$PWD/build/asan/conch-init}
PY=/usr/bin/python3
status=0

mkdir -p build/py
protoc --python_out=build/py -Iproto proto/agent.proto || exit 1
export PYTHONPATH=$PWD/build/py:$PWD/tests/integration${PYTHONPATH:+:$PYTHONPATH}

echo "== pytest: tests/integration"
$PY -m pytest -q -p no:cacheprovider tests/integration || status=1

if [ -d tests/node ] && ls tests/node/*.test.mjs >/dev/null 2>&1; then
  echo "== node --test: tests/node (official @connectrpc/connect-node client)"
  (cd tests/node && node --test --test-reporter=spec *.test.mjs) || status=1
fi

if [ -x tests/ns/run.sh ]; then
  echo "== namespaces: tests/ns"
  tests/ns/run.sh || status=1
fi
exit $status
