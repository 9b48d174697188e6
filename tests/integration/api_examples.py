"""The API examples users rely on, kept as written in
tests/cases/api-examples.sh: the loader the tests that run them share
(tests/vm/test_vm.py, test_files.py)."""
import os

API_EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases", "api-examples.sh")


def api_curls(path=API_EXAMPLES):
    """Every curl command of the file, in order, each as written (its
    lines joined by \\n): a command starts with "curl " at the start of a
    line and goes on while its last line ends in a backslash or a single
    quote is left open."""
    lines = open(path, encoding="utf-8").read().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("curl "):
            block = [lines[i]]
            while block[-1].rstrip().endswith("\\") or "\n".join(block).count("'") % 2:
                i += 1
                block.append(lines[i])
            out.append("\n".join(block))
        i += 1
    return out


def api_curl(route):
    """The one example whose URL is ${AGENT_URL} + route."""
    found = [c for c in api_curls() if '"${AGENT_URL}' + route + '"' in c]
    assert len(found) == 1, (route, found)
    return found[0]
