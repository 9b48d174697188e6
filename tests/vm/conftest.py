"""Fixtures of the VM suite: a booted, initialised microVM per layout."""
import os
import secrets
import sys

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import vm as vmmod  # noqa: E402
from conch import Client  # noqa: E402

# The integration suite's client helpers (test_process) import from a
# module named conftest: give them the integration conftest's names.
import importlib.util  # noqa: E402
_spec = importlib.util.spec_from_file_location(
    "integration_conftest", os.path.join(HERE, "..", "integration", "conftest.py"))
_ic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ic)
ROOT, Server, free_port, sanitizer_report, status_kib = (
    _ic.ROOT, _ic.Server, _ic.free_port, _ic.sanitizer_report, _ic.status_kib)

BOOT_TIMEOUT = 300  # TCG on a busy 2-core machine: generous on purpose


def boot(layout, name, tmp_path_factory, **kw):
    v = vmmod.VM(layout, workdir=str(tmp_path_factory.mktemp(name)), name=name, **kw)
    try:
        v.start()
        v.wait_log("waiting for the init message", timeout=BOOT_TIMEOUT)
        v.token = secrets.token_hex(16)
        v.ready(v.token)
    except BaseException:
        v.close()  # never leave a guest running on the shared machine
        raise
    v.client = Client(v.url, v.token)
    return v


@pytest.fixture(scope="session", autouse=True)
def _image_is_current():
    """The image must hold the binary built last (make vm-image)."""
    import hashlib
    binp = os.path.join(vmmod.ROOT, "build", "static", "conch-init")
    shap = os.path.join(vmmod.IMAGES, "conch-init.sha256")
    if not os.path.exists(shap) or not os.path.exists(binp):
        pytest.fail("no VM image: run `make vm-image` (or `make vm-check`)", pytrace=False)
    have = hashlib.sha256(open(binp, "rb").read()).hexdigest()
    if open(shap).read().strip() != have:
        pytest.fail("build/vm holds an older conch-init: run `make vm-image`", pytrace=False)


@pytest.fixture(scope="module")
def pmem_vm(tmp_path_factory):
    v = boot("pmem", "pmem", tmp_path_factory)
    yield v
    v.close()


@pytest.fixture(scope="module")
def blk_vm(tmp_path_factory):
    v = boot("blk", "blk", tmp_path_factory)
    yield v
    v.close()
