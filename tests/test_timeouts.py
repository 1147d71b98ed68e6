"""Every test has a time limit: a deadlock fails, with a stack of every thread, instead of hanging.

The limit is pytest-timeout's (``timeout`` and ``timeout_method = "thread"`` in pyproject.toml;
slow tests raise it with ``@pytest.mark.timeout``). Here a small test file that deadlocks on
purpose runs in a subprocess, and must fail within its limit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DEADLOCK = '''
import threading

import pytest

from multiconnector import ConnectorRegistry, MultiConnector


class Saver:
    def request_finished(self, request_id, blocks):
        return True, None


def interrupted_batch(mc):
    """A batch that takes every stripe lock and, planted bug, loses them when interrupted."""
    for lock in mc._locks:
        lock.acquire()
    raise KeyboardInterrupt  # no `finally` releases the locks


def test_a_report_after_an_interrupted_batch():
    mc = MultiConnector(ConnectorRegistry({"a": Saver()}), stripes=2)
    mc.begin("r")
    mc.request_finished("r")
    with pytest.raises(KeyboardInterrupt):
        interrupted_batch(mc)
    reporter = threading.Thread(
        target=mc.transfer_finished, args=("r", "a"), name="stuck-reporter"
    )
    reporter.start()
    reporter.join()  # never returns: the request's stripe lock is still held
'''


def test_the_configured_limit_is_a_thread_dump_not_a_signal(pytestconfig: pytest.Config) -> None:
    # The default every test gets, and the method that dumps every thread's stack.
    assert float(pytestconfig.getini("timeout")) > 0
    assert pytestconfig.getini("timeout_method") == "thread"


@pytest.mark.timeout(120)
def test_a_deadlocked_test_fails_within_its_limit_with_every_threads_stack(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_deadlock.py").write_text(DEADLOCK)
    # The method pyproject.toml sets, with a 2 s limit to keep this test short.
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntimeout = 2\ntimeout_method = thread\naddopts = -p no:cacheprovider\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", str(tmp_path / "test_deadlock.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,  # the hang this test guards against would stop here, as a failure
        check=False,
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert elapsed < 60, elapsed  # the 2 s limit plus interpreter start-up: never a hang
    assert "+ Timeout +" in output, output
    # The stack of every thread: the stuck reporter waiting for its lock, and the test itself.
    assert "Stack of stuck-reporter" in output, output
    assert "in transfer_finished" in output, output
    assert "in test_a_report_after_an_interrupted_batch" in output, output
