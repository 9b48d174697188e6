"""The namespace suite needs root and sandbox.py's tools: without them it
fails, with the reason, instead of skipping."""
import os

import pytest

import sandbox as sbx


@pytest.fixture(scope="session", autouse=True)
def _requirements():
    if os.geteuid() != 0:
        pytest.fail("tests/ns needs root (namespaces, loop devices, mounts)", pytrace=False)
    if sbx.missing_tools():
        pytest.fail(f"tests/ns: missing tools: {sbx.missing_tools()}", pytrace=False)
