"""The engine tests' own harness: a child run that times out fails its test with what it was doing."""

import sys

import pytest
from _engine_helpers import run_bounded


def test_a_run_that_times_out_fails_with_every_threads_stack_and_its_startup_log(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "startup.log").write_text("loading the model")
    code = ("import threading, time\n"
            "def waiting_on_a_lock(): time.sleep(600)\n"
            "threading.Thread(target=waiting_on_a_lock, daemon=True).start()\n"
            "print('started', flush=True); time.sleep(600)\n")
    with pytest.raises(pytest.fail.Exception) as failed:
        run_bounded([sys.executable, "-c", code], timeout=3, logs=tmp_path)
    text = str(failed.value)
    assert "timed out after 3 s" in text
    assert "waiting_on_a_lock" in text and "Current thread" in text  # faulthandler's dump of both threads
    assert "startup.log:\nloading the model" in text
