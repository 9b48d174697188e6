#!/bin/sh
# The API examples users rely on, kept as written.
#
# These are the curl examples of the agent API guide users were given:
# the health check, ProcessService List and SendSignal, FileService
# ListFiles and SearchFiles.  Users paste them as they stand, so they must
# keep working as they stand: each command below is copied verbatim, and a
# test that runs one may only add curl options in front of its arguments
# (the HTTP version, a timeout), never change the command.  A new example
# goes below the others in the same form.
#
# What they expect: AGENT_URL (http://HOST:4064) and AGENT_TOKEN in the
# environment; for SendSignal a background process tagged http-srv; for
# ListFiles and SearchFiles the guide's example tree /tmp/conch-doc-api
# (files a.txt, remote.txt, target/main.py, target/old.py.bak and the
# directory link linked -> target).  By hand, against `make run`:
#
#   AGENT_URL=http://127.0.0.1:4064 AGENT_TOKEN=TOKEN sh tests/cases/api-examples.sh
#
# Read by tests/integration/api_examples.py, for tests/vm/test_vm.py (all
# of them, HTTP/1.1 and h2 prior knowledge, against a booted guest) and
# tests/integration/test_files.py (ListFiles, SearchFiles): a command
# starts with "curl " at the start of a line and goes on while its last
# line ends in a backslash or a single quote is left open.

curl --request GET \
  --url "${AGENT_URL}/health"
echo

curl --request POST \
  --url "${AGENT_URL}/pb.ProcessService/List" \
  --header 'Connect-Protocol-Version: 1' \
  --header 'Content-Type: application/json' \
  --header "conch-init-token: ${AGENT_TOKEN}" \
  --data '{}'
echo

curl --request POST \
  --url "${AGENT_URL}/pb.ProcessService/SendSignal" \
  --header 'Connect-Protocol-Version: 1' \
  --header 'Content-Type: application/json' \
  --header "conch-init-token: ${AGENT_TOKEN}" \
  --data '{
    "process": {
      "tag": "http-srv"
    },
    "signal": 15
  }'
echo

curl --request POST \
  --url "${AGENT_URL}/pb.FileService/ListFiles" \
  --header 'Connect-Protocol-Version: 1' \
  --header 'Content-Type: application/json' \
  --header "conch-init-token: ${AGENT_TOKEN}" \
  --data '{
    "path": "/tmp/conch-doc-api",
    "depth": 2
  }'
echo

curl --request POST \
  --url "${AGENT_URL}/pb.FileService/SearchFiles" \
  --header 'Connect-Protocol-Version: 1' \
  --header 'Content-Type: application/json' \
  --header "conch-init-token: ${AGENT_TOKEN}" \
  --data '{
    "path": "/tmp/conch-doc-api",
    "pattern": "*.py",
    "excludePatterns": ["*.bak"]
  }'
echo
