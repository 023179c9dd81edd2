"""environments.diagnosis: the causes recognised in real-shaped logs (what npm, pip, curl, the shells and the
providers' readiness lines print), the hint each answers, and the failures it does not guess at."""

from __future__ import annotations

import pytest

from environments.diagnosis import Cause, FailedCommand, Stage, diagnose

# As npm 10 and pip 23 print them in the bubblewrap sandbox with no network (setup_network off).
NPM_EAI_AGAIN = """$ npm view left-pad version --fetch-retries=0
npm error code EAI_AGAIN
npm error syscall getaddrinfo
npm error errno EAI_AGAIN
npm error request to https://registry.npmjs.org/left-pad failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org
npm error A complete log of this run can be found in: /root/.npm/_logs/2026-12-06T02_46_30_057Z-debug-0.log
"""
NPM_ENOTFOUND = """$ npm ci
npm ERR! code ENOTFOUND
npm ERR! syscall getaddrinfo
npm ERR! errno ENOTFOUND
npm ERR! network request to https://registry.npmjs.org/express failed, reason: getaddrinfo ENOTFOUND registry.npmjs.org
npm ERR! network This is a problem related to network connectivity.
"""
PIP_NAME_RESOLUTION = """$ python3 -m pip install -r requirements.txt
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f542ca44c90>: Failed to establish \
a new connection: [Errno -3] Temporary failure in name resolution')': /simple/six/
ERROR: Could not find a version that satisfies the requirement six (from versions: none)
ERROR: No matching distribution found for six
"""
# pip with --retries 0 never prints the connection error: only that the index had no versions.
PIP_NO_VERSIONS = """$ python3 -m pip download --retries 0 --no-deps -d /tmp/dl six
ERROR: Could not find a version that satisfies the requirement six (from versions: none)
ERROR: No matching distribution found for six
"""
CURL = "$ curl -sS https://pypi.org/simple/\ncurl: (6) Could not resolve host: pypi.org\n"
DASH_NOT_FOUND = "$ nosuchtool --x\n/bin/sh: 1: nosuchtool: not found\n"
BASH_NOT_FOUND = "$ make deps\nbash: line 1: make: command not found\n"
EGRESS_REFUSED = """$ npm ci --registry https://npm.example.com/
npm error code ECONNRESET
# egress: refused npm.example.com:443: not in the egress allowlist
"""


def setup(command: str, code: int | None = 1, *, network: bool = False) -> FailedCommand:
    return FailedCommand(Stage.SETUP, command, code, setup_network=network)


@pytest.mark.parametrize(
    ("command", "log"),
    [
        ("npm view left-pad version --fetch-retries=0", NPM_EAI_AGAIN),
        ("npm ci", NPM_ENOTFOUND),
        ("python3 -m pip install -r requirements.txt", PIP_NAME_RESOLUTION),
        ("python3 -m pip download --retries 0 --no-deps -d /tmp/dl six", PIP_NO_VERSIONS),
        ("curl -sS https://pypi.org/simple/", CURL),
    ],
)
def test_a_network_error_in_a_setup_without_network_names_setup_network(command: str, log: str) -> None:
    found = diagnose(setup(command), log)
    assert found is not None and found.cause == Cause.NO_SETUP_NETWORK
    assert "`setup_network: true`" in found.hint and "durafix.yaml" in found.hint
    # The hint is for a public ticket: nothing of the log is quoted.
    assert "registry.npmjs.org" not in found.hint and "pypi.org" not in found.hint


def test_a_network_error_with_setup_network_on_names_the_egress_allowlist() -> None:
    found = diagnose(setup("npm ci", network=True), NPM_ENOTFOUND)
    assert found is not None and found.cause == Cause.EGRESS_REFUSED
    assert "DURAFIX_SETUP_EGRESS" in found.hint and "setup_network" not in found.hint
    refused = diagnose(setup("npm ci --registry https://npm.example.com/", network=True), EGRESS_REFUSED)
    assert refused is not None and refused.cause == Cause.EGRESS_REFUSED
    assert "npm.example.com" not in refused.hint


def test_a_program_not_found_names_it_only_when_it_is_the_recipes() -> None:
    dash = diagnose(setup("nosuchtool --x", 127), DASH_NOT_FOUND)
    assert dash is not None and dash.cause == Cause.COMMAND_NOT_FOUND
    assert "`nosuchtool` was not found" in dash.hint and "image.packages" in dash.hint
    bash = diagnose(setup("make deps", 127), BASH_NOT_FOUND)
    assert bash is not None and "`make` was not found" in bash.hint
    # Exit 127 from a program the log names but the command does not: said without the log's word.
    inner = diagnose(setup("./scripts/bootstrap.sh", 127), "$ ./scripts/bootstrap.sh\nrustup: not found\n")
    assert inner is not None and inner.cause == Cause.COMMAND_NOT_FOUND and "rustup" not in inner.hint
    # The tests' command too, and a start command (still running or not) whose word the shell did not find.
    tests = diagnose(FailedCommand(Stage.TESTS, "pytest -q", 127), "/bin/sh: 1: pytest: not found\n")
    assert tests is not None and "`pytest` was not found where the tests command runs" in tests.hint
    start = diagnose(FailedCommand(Stage.START, "uvicorn app:app --port $PORT"), "/bin/sh: 1: uvicorn: not found\n")
    assert start is not None and start.cause == Cause.COMMAND_NOT_FOUND


def test_readiness_verdicts_name_the_port_or_the_path() -> None:
    start = FailedCommand(Stage.START, "python3 -m http.server 8000")
    silent = diagnose(start, "$ python3 -m http.server 8000\n# readiness: nothing answered on $PORT (ConnectError)\n")
    assert silent is not None and silent.cause == Cause.NOT_LISTENING and "`$PORT`" in silent.hint
    log = "127.0.0.1 - - [06/Dec/2026 02:50:01] code 404, message File not found\n"
    log += "# readiness: GET /healthz answered 404, expected 200\n"
    wrong = diagnose(FailedCommand(Stage.START, "python3 app.py --port $PORT"), log)
    assert wrong is not None and wrong.cause == Cause.READINESS_STATUS
    assert "GET /healthz with 404" in wrong.hint and "`readiness.path`" in wrong.hint


def test_a_start_the_recipe_does_not_declare_is_said_with_the_fields_to_add() -> None:
    """The app was needed and the recipe has no ``start``: no command failed, none was declared (the empty
    command), whatever the log says; the hint names what to add and the way without an app."""
    found = diagnose(FailedCommand(Stage.START, ""), "/bin/sh: 1: node: not found\n")
    assert found is not None and found.cause == Cause.NO_APP
    assert "declares no `start`" in found.hint and "add `start`" in found.hint and "`readiness`" in found.hint
    assert "reproduce with a command or test" in found.hint
    # Only an undeclared start: other stages with no command are not guessed at.
    assert diagnose(FailedCommand(Stage.SETUP, ""), "") is None


def test_tests_with_network_errors_are_told_they_never_have_the_network() -> None:
    log = (
        "E   urllib3.exceptions.NewConnectionError: <urllib3.connection.HTTPSConnection object at 0x7f0>: "
        "Failed to establish a new connection: [Errno -3] Temporary failure in name resolution\n1 failed"
    )
    found = diagnose(FailedCommand(Stage.TESTS, "python3 -m pytest", 1), log)
    assert found is not None and found.cause == Cause.TESTS_NEED_NETWORK and "never have the network" in found.hint


@pytest.mark.parametrize(
    "log",
    [
        # What python3 -m venv prints on Debian without python3-venv.
        "The virtual environment was not created successfully because ensurepip is not\navailable.  On Debian/"
        "Ubuntu systems, you need to install the python3-venv\npackage using the following command.\n"
        "Error: Command '['/workspace/.venv/bin/python3', '-m', 'ensurepip', '--upgrade', '--default-pip']' "
        "returned non-zero exit status 1.\n",
        "/usr/bin/python3: No module named venv\n",
    ],
)
def test_a_virtual_environment_without_venv_names_python3_venv_for_the_image(log: str) -> None:
    found = diagnose(FailedCommand(Stage.SETUP, "python3 -m venv .venv", 1, setup_network=True), log)
    assert found is not None and found.cause == Cause.NO_VENV
    assert "add `python3-venv` to `image.packages`" in found.hint
    # Tests saying the same are not setup's virtual environment.
    assert diagnose(FailedCommand(Stage.TESTS, "python3 -m pytest", 1), log) is None


def test_failures_without_a_recognised_cause_are_not_guessed_at() -> None:
    assert diagnose(setup("npm ci"), "npm error code EUSAGE\nnpm error `npm ci` needs a package-lock.json\n") is None
    assert diagnose(setup("python3 setup.py build", None), "$ python3 setup.py build\n") is None
    assert diagnose(FailedCommand(Stage.START, "node server.js"), "Error: Cannot find module 'express'\n") is None
    assert (
        diagnose(FailedCommand(Stage.TESTS, "npm test", 1), "1 failing\nAssertionError: expected 3 to equal 4\n")
        is None
    )
    # A file the program did not find is not a program the shell did not find.
    assert diagnose(setup("cat missing.txt"), "cat: missing.txt: No such file or directory\n") is None
    # ... while an exec that found no file is (exit 127).
    exec_missing = diagnose(setup("./configure", 127), "/bin/sh: 1: ./configure: No such file or directory\n")
    assert exec_missing is not None and "`./configure` was not found" in exec_missing.hint


# pip 23 behind a TLS-inspecting proxy whose CA the image does not trust; npm 9 likewise.
PIP_UNTRUSTED = """$ python3 -m pip install -e .
Could not fetch URL https://pypi.org/simple/markdown/: There was a problem confirming the ssl certificate: \
HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded with url: /simple/markdown/ (Caused by \
SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed \
certificate in certificate chain (_ssl.c:1006)'))) - skipping
ERROR: Could not find a version that satisfies the requirement markdown (from versions: none)
"""
NPM_UNTRUSTED = """$ npm ci
npm ERR! code SELF_SIGNED_CERT_IN_CHAIN
npm ERR! errno SELF_SIGNED_CERT_IN_CHAIN
npm ERR! request to https://registry.npmjs.org/is-number failed, reason: self-signed certificate in certificate chain
"""


@pytest.mark.parametrize("log", [PIP_UNTRUSTED, NPM_UNTRUSTED], ids=["pip", "npm"])
def test_a_registry_certificate_setup_does_not_trust_names_the_ca_bundle_setting(log: str) -> None:
    found = diagnose(FailedCommand(Stage.SETUP, "npm ci", 1, setup_network=True), log)
    assert found is not None and found.cause == Cause.TLS_UNTRUSTED
    assert "`DURAFIX_CA_BUNDLE`" in found.hint and "durafix worker --check" in found.hint
    # Without the network the same words cannot come from a registry: not this cause.
    offline = diagnose(FailedCommand(Stage.SETUP, "npm ci", 1), log)
    assert offline is None or offline.cause != Cause.TLS_UNTRUSTED
