"""Fixtures: real pe-executord daemons on private sockets (--socket
ipc://TMP/sock --state-dir TMP/state), as tests/e2e start them, and
clients of them. PE_BUILD_DIR names the build tree (default: the
checkout's build/)."""
import os

import pytest

from helpers import Daemon


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("pe"))
    os.environ["PE_SOCKET"] = d.address
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


@pytest.fixture
def spare_daemon(tmp_path):
    """A daemon of the test's own, to kill."""
    d = Daemon(tmp_path, places="cpu:1")
    yield d
    d.stop()
