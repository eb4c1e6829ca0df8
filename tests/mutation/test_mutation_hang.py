"""The mutation plugin's hang limit (mutants/mutation/plugin.py): a test that runs past it fails,
so mutmut reads a mutant that loops for ever as killed within the limit instead of holding a core
until its CPU limit; code that swallows the first alarm is interrupted again; a test within the
limit is untouched and leaves no timer behind."""
import signal
import textwrap
import time

import pytest

from mutants.mutation import plugin as mutation_plugin

SUITE = '''
import time

def test_spins_for_ever():
    while True:
        pass

def test_swallows_the_first_alarm():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            while True:
                pass
        except Exception:
            continue  # a broad except in an engine loop

def test_within_the_limit():
    time.sleep(0.05)
'''


def run_suite(tmp_path, monkeypatch, limit: float) -> dict[str, str]:
    monkeypatch.setattr(mutation_plugin, "HANG_LIMIT_S", limit)
    monkeypatch.setattr(mutation_plugin, "HANG_REPEAT_S", 0.2)
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    outcomes: dict[str, str] = {}

    class Outcomes:
        @staticmethod
        def pytest_runtest_logreport(report):
            if report.when == "call":
                outcomes[report.nodeid.split("::")[-1]] = report.outcome + (
                    ": hang" if "a hang (mutants/mutation/plugin.py)" in str(report.longrepr) else "")
    pytest.main([str(tmp_path / "test_suite.py"), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
                plugins=[mutation_plugin, Outcomes()])
    return outcomes


def test_a_test_past_the_limit_fails_as_a_hang_even_when_the_first_alarm_is_caught(tmp_path, monkeypatch):
    t0 = time.monotonic()
    outcomes = run_suite(tmp_path, monkeypatch, limit=0.5)
    assert outcomes == {"test_spins_for_ever": "failed: hang", "test_swallows_the_first_alarm": "failed: hang",
                        "test_within_the_limit": "passed"}
    assert time.monotonic() - t0 < 20, "the hangs were not cut at their limit"
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0), "a timer was left running after the tests"


def test_a_cuda_run_s_tests_are_not_timed(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGATE_DEVICE", "cuda")
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(1.0)\n")
    monkeypatch.setattr(mutation_plugin, "HANG_LIMIT_S", 0.2)
    assert pytest.main([str(tmp_path / "test_slow.py"), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
                       plugins=[mutation_plugin]) == 0


def test_the_limit_is_six_times_the_suite_s_slowest_test_and_far_above_a_loaded_machine_s_run():
    # mutmut's stats of 2026-12-04: the slowest of 1,615 tests took 20.0 s alone; two children
    # sharing two cores with other work run a test about twice as slow
    assert mutation_plugin.HANG_LIMIT_S >= 6 * 20.0
