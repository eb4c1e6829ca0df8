"""The host's load around the timed gates (gates/hostload.py): what other processes took of the CPU
is read from /proc/stat less our own time, a real busy process counts, the timed phase of
`gates run` on CUDA starts only after a quiet probe (or names that it never came), and busy's red
line carries the figure."""
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from gates import hostload, registry
from gates.hostload import CpuSample, QuietWait

LINUX = Path(hostload.PROC_STAT).is_file()


def test_other_processes_cores_are_the_host_s_busy_time_less_our_own_over_the_wall_time():
    before, after = CpuSample(busy_s=10.0, own_s=2.0, at=100.0), CpuSample(busy_s=13.5, own_s=2.5, at=102.0)
    assert hostload.other_cores(before, after) == pytest.approx(1.5)
    assert hostload.other_cores(before, CpuSample(10.5, 3.0, 101.0)) == 0.0  # our own time, never negative
    assert hostload.other_cores(None, after) is None and hostload.other_cores(after, before) is None


def test_a_stat_file_is_read_by_its_busy_fields_and_anything_else_is_no_sample(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice: idle and iowait are not busy
    stat.write_text("cpu  100 7 50 100000 900 5 5 20 3 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert hostload.sample(str(stat)).busy_s == pytest.approx(187 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("intr 1 2 3\n")
    assert hostload.sample(str(stat)) is None
    assert hostload.sample(str(tmp_path / "missing")) is None


@pytest.mark.skipif(not LINUX, reason="reads /proc/stat")
def test_a_spinning_process_beside_us_counts_as_other_load():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cores = hostload.probe(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert cores is not None and cores >= 0.3, cores  # a whole core, less what a shared machine takes


def test_the_wait_ends_at_the_first_quiet_probe_or_gives_up_and_says_so():
    readings = iter([1.6, 0.9, 0.2, 3.0])
    waited = hostload.wait_for_quiet_host(max_probes=5, measure=lambda: next(readings))
    assert (waited.quiet, waited.probes, waited.other_cores) == (True, 3, 0.2)
    assert "quiet;" in waited.line()

    busy = hostload.wait_for_quiet_host(max_probes=4, measure=lambda: 1.5)
    assert (busy.quiet, busy.probes, busy.other_cores) == (False, 4, 1.5)
    assert "still busy" in busy.line() and "timed anyway" in busy.line()

    unknown = hostload.wait_for_quiet_host(measure=lambda: None)
    assert (unknown.quiet, unknown.probes) == (True, 1) and "not measured" in unknown.line()


def test_a_red_line_names_each_runner_s_load_and_says_nothing_without_figures():
    loads = {"sync": hostload.summary([0.1, 0.3, 0.2]), "async": hostload.summary([1.2, None, 0.4])}
    assert loads == {"sync": {"median": 0.2, "max": 0.3}, "async": {"median": 0.8, "max": 1.2}}
    line = hostload.during_windows(loads)
    assert "sync median 0.2 (max 0.3)" in line and "async median 0.8 (max 1.2)" in line
    assert hostload.during_windows({"sync": hostload.summary([None]), "async": None}) == ""


GATE = '''
from pathlib import Path

def test_mark(gate_record):
    Path({marker!r}).write_text("ran")
    gate_record.case(marker={marker!r})
    gate_record.occurred("ran")

CLAIMS = ("ran",)
'''


def fake_gate(tmp_path, name: str, timed: bool) -> tuple[registry.Gate, Path]:
    module, marker = tmp_path / f"fake_{name}.py", tmp_path / f"{name}.ran"
    module.write_text(GATE.format(marker=str(marker)))
    return registry.Gate(f"fake-{name}", module.stem, "fake gate", "cpu", module, timed=timed), marker


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_on_cuda_the_timed_phase_waits_for_a_quiet_host_after_the_others_and_the_report_keeps_it(
        tmp_path, monkeypatch, device):
    from gates.run import run_gates
    (untimed, untimed_ran), (timed, timed_ran) = fake_gate(tmp_path, "plain", False), fake_gate(tmp_path, "timed", True)
    seen = []

    def wait():  # what had run when the wait came
        seen.append((untimed_ran.exists(), timed_ran.exists()))
        return QuietWait(quiet=True, waited_s=3.0, other_cores=0.12, probes=3)

    monkeypatch.setattr(hostload, "wait_for_quiet_host", wait)
    report = run_gates([untimed, timed], str(tmp_path / "g.json"), quiet=True, device=device, jobs=2).to_json()
    assert [g["status"] for g in report["gates"]] == ["green", "green"]
    if device == "cuda":
        assert seen == [(True, False)]
        assert report["environment"]["host_before_timed"] == asdict(wait())
    else:  # the CPU times nothing that decides: no wait, nothing recorded
        assert seen == [] and "host_before_timed" not in report["environment"]
