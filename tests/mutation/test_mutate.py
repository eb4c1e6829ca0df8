"""`specgate mutate`: staging never touches our mutants/, --since finds the changed functions,
a real (tiny) mutmut run is read back into records, and a changed suite resets cached verdicts
(the ratchet and the reviewed equivalents: test_mutation_ratchet.py)."""
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from mutants.mutation import results, stage
from mutants.mutation import run as mutation_run
from mutants.mutation.report import summarise

REPO = Path(__file__).resolve().parents[2]

def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def engine_repo(tmp_path):
    """A git repo with engine/calc.py: a function and a class with two methods, committed."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "calc.py").write_text(textwrap.dedent("""\
        def add(a, b):
            return a + b


        class Box:
            def __init__(self, x):
                self.x = x

            @property
            def double(self):
                return 2 * self.x
        """))
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "calc")
    return tmp_path


def test_since_names_only_the_changed_function_and_method(engine_repo):
    calc = engine_repo / "engine" / "calc.py"
    assert mutation_run.changed_functions("HEAD", engine_repo) == []
    calc.write_text(calc.read_text().replace("2 * self.x", "self.x + self.x"))
    assert mutation_run.changed_functions("HEAD", engine_repo) == ["engine.calc.xǁBoxǁdouble__mutmut_*"]
    calc.write_text(calc.read_text().replace("a + b", "b + a"))
    assert mutation_run.changed_functions("HEAD", engine_repo) == ["engine.calc.x_add__mutmut_*",
                                                             "engine.calc.xǁBoxǁdouble__mutmut_*"]


def test_since_counts_a_deleted_line_and_a_new_file(engine_repo):
    calc = engine_repo / "engine" / "calc.py"
    calc.write_text(calc.read_text().replace("        self.x = x\n", "        pass\n        self.x = x\n"))
    (engine_repo / "engine" / "more.py").write_text("def sub(a, b):\n    return a - b\n")
    git(engine_repo, "add", "engine/more.py")
    assert mutation_run.changed_functions("HEAD", engine_repo) == ["engine.calc.xǁBoxǁ__init____mutmut_*",
                                                             "engine.more.x_sub__mutmut_*"]


def test_since_refuses_an_unknown_revision(engine_repo):
    with pytest.raises(ValueError, match="no-such-rev"):
        mutation_run.changed_functions("no-such-rev", engine_repo)


def test_function_spans_start_at_the_decorator():
    spans = mutation_run.function_spans("class C:\n    x = 1\n\n    @staticmethod\n    def m():\n        return 1\n"
                                  "\n\ndef f():\n    pass\n")
    assert spans == [("xǁCǁm", 4, 6), ("x_f", 9, 10)]


def test_staging_holds_the_suite_and_never_our_mutants_package(tmp_path):
    staging = tmp_path / "build" / "mutmut"
    (staging / "mutants" / "engine").mkdir(parents=True)
    cached = staging / "mutants" / "engine" / "verify.py.meta"
    cached.write_text("{}")
    stale_test = staging / "mutants" / "tests" / "test_removed.py"
    stale_test.parent.mkdir(parents=True)
    stale_test.write_text("")
    stage.stage(staging)
    assert (staging / "engine" / "runner.py").exists() and (staging / "mutation_plugin.py").exists()
    assert (staging / "tests" / "engine" / "test_engine.py").exists() and (staging / "tests" / "helpers").is_dir()
    assert {p.name for p in (staging / "tests").iterdir() if p.is_dir()} == {"engine", "bench", "gates", "helpers"}
    assert cached.exists(), "mutmut's cache was removed"
    assert not stale_test.exists(), "a removed test lingers in mutmut's working copy"
    # A staged test that imports our mutants/ package (or a test of it) at collection would stop
    # every mutation run at mutmut's clean-test step: in its working copy that name is mutmut's.
    for test in (staging / "tests").rglob("test_*.py"):
        top_level = [line for line in test.read_text().splitlines() if line.startswith(("import ", "from "))]
        assert not any(line.split()[1].split(".")[0] in ("mutants", "test_prove") for line in top_level), test.name
    assert not (staging / "mutants" / "catalogue.py").exists()
    config = tomllib.loads((staging / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert config["source_paths"] == ["engine", "gates"] and "mutants" not in config["also_copy"]
    assert config["only_mutate"] == ["engine/*", *stage.MUTATED_GATES] and "gates" not in config["also_copy"]
    assert all((REPO / path).is_file() for path in stage.MUTATED_GATES)
    assert config["timeout_multiplier"] < 15, "mutmut's default lets a hung mutant hold a core for long"


def test_staging_config_selects_existing_tests_and_deselects_real_ones():
    for path in stage.SUITE:
        assert (REPO / path).exists(), path
    for node in stage.DESELECTED:
        file, name = node.split("::")
        assert f"def {name}(" in (REPO / file).read_text(), node



def test_the_suite_s_test_ids_survive_a_second_collection_in_one_process():
    """mutmut collects the suite, then runs tests by id, in one process. pytest escapes an
    explicit `ids=` entry in place, so an id with a backslash changes on the second collection
    and the run stops with 'not found' (pytest exit 4): name such cases without backslashes."""
    script = textwrap.dedent(f"""\
        import contextlib, io, json, sys, pytest
        class Ids:
            def pytest_collection_modifyitems(self, items):
                self.ids = [item.nodeid for item in items]
        runs = []
        for _ in range(2):
            ids = Ids()
            with contextlib.redirect_stdout(io.StringIO()):
                pytest.main(["--collect-only", "-p", "gates.plugin", *{list(stage.SUITE)!r}], plugins=[ids])
            runs.append(ids.ids)
        json.dump(runs, sys.stdout)""")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    first, second = json.loads(proc.stdout)
    assert len(first) > 500, "the suite was not collected"
    assert sorted(set(first) - set(second)) == []

@pytest.mark.parametrize("args, message", [
    (["--max-children", "0"], "argument --max-children: must be an integer >= 1, got 0"),
    (["--since", "no-such-rev"], "no-such-rev"),
    (["--since", "HEAD", "--update-baseline"], "needs a full run"),
    (["--only", "engine.verify.*", "--update-baseline"], "needs a full run"),
    (["--since", "HEAD", "--only", "engine.verify.*"], "not both"),
])
def test_bad_arguments_exit_2_with_a_clear_error(capsys, args, message):
    from specgate_cli import main
    try:
        status = main(["mutate", *args])
    except SystemExit as e:  # refused by the parser itself
        status = e.code
    assert status == 2
    assert message in capsys.readouterr().err


def test_a_real_mutmut_run_is_read_back_as_killed_and_survived(tmp_path, capsys):
    """mutmut 3.8 over a two-function package, from a staging folder: one function's mutants are
    all killed by its test, the other has no test; the records and scores say so."""
    staging = tmp_path / "staging"
    (staging / "engine").mkdir(parents=True)
    (staging / "tests").mkdir()
    (staging / "engine" / "__init__.py").write_text("")
    (staging / "engine" / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\n"
                                               "def scale(x):\n    return x * 3\n")
    (staging / "tests" / "test_calc.py").write_text(
        "from engine.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (staging / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["engine"]\n'
                                            'pytest_add_cli_args_test_selection = ["tests"]\n')
    rc, stopped = mutation_run.run_mutmut([], 1, tmp_path / "mutmut.log", staging)
    assert (rc, stopped) == (0, False), (tmp_path / "mutmut.log").read_text()[-2000:]
    progress = capsys.readouterr().err  # not a terminal: progress as lines, the last at the end
    assert re.search(r"mutate: (\d+)/\1 mutants checked: \d+ killed", progress), progress
    records = results.read_results([], {}, staging)
    by_function = {}
    for r in records:
        by_function.setdefault(r.function, set()).add(r.status)
    assert by_function == {"add": {"killed"}, "scale": {"no tests"}}
    add = next(r for r in records if r.function == "add")
    assert add.path == "engine/calc.py" and add.covered_by == ("tests/test_calc.py::test_add",)
    assert add.diff.startswith("--- engine/calc.py") and "-    return a + b" in add.diff
    summary = summarise(records)
    assert summary["test_strength"] == 1.0 and summary["mutation_score"] < 1.0
    assert not (REPO / "build" / "mutmut" / "mutants" / "calc.py").exists()


def test_a_changed_suite_resets_every_cached_verdict_but_kills(tmp_path):
    staging = tmp_path / "staging"
    assert stage.stage(staging) == 0
    meta = staging / "mutants" / "engine" / "verify.py.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": {"killed": 1, "survived": 0, "timeout": 36, "new": None},
                                "durations_by_key": {"killed": 0.5, "survived": 9.0}}))
    assert stage.stage(staging) == 0, "an unchanged suite must keep the cache"
    assert results.cached_verdicts([], staging) == {"killed": 0.5, "survived": 9.0, "timeout": None}
    assert results.cached_verdicts(["surv*"], staging) == {"survived": 9.0}
    (staging / "suite.sha256").write_text("an older suite")
    assert stage.stage(staging) == 2
    assert json.loads(meta.read_text())["exit_code_by_key"] == {"killed": 1, "survived": None, "timeout": None,
                                                               "new": None}
    assert results.cached_verdicts([], staging) == {"killed": 0.5}  # the run's speed counts the other three


def test_the_plugin_runs_bounded_tests_first_then_the_fastest(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from mutants.mutation import plugin as mutation_plugin

    def item(nodeid, bounded=False):
        return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: object() if bounded else None)
    items = [item("slow"), item("fast"), item("unknown"), item("bounded-slow", True), item("bounded-fast", True)]
    monkeypatch.chdir(tmp_path)
    mutation_plugin.pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items][0] == "slow", "without mutmut's stats the order is left alone"
    (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": {
        "slow": 3.0, "fast": 0.1, "bounded-slow": 2.0, "bounded-fast": 0.5}}))
    mutation_plugin.pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items] == ["bounded-fast", "bounded-slow", "fast", "slow", "unknown"]


def test_a_child_that_dies_holding_tqdm_s_lock_does_not_hang_the_next(monkeypatch):
    """mutmut forks every child from one process: tqdm's default lock is a semaphore they all
    share, and a mutant that breaks a bar dies holding it. The plugin gives each child its own."""
    import io
    import multiprocessing

    import tqdm as tqdm_module

    from mutants.mutation import plugin as mutation_plugin

    def child(body) -> int:
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest: 1 if the body raised
            try:
                body()
            except BaseException:
                os._exit(1)
            os._exit(0)
        for _ in range(200):  # 10 s
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return -9
    # A semaphore of this test's own, shared across fork as tqdm's default one is. Never tqdm's
    # default lock itself: its semaphore is class-wide, and a child dying with it held would hang
    # every later bar in this pytest process.
    bar = tqdm_module.tqdm
    monkeypatch.setattr(bar, "_lock", multiprocessing.RLock(), raising=False)
    assert child(lambda: bar.get_lock().acquire()) == 0  # dies holding the shared lock

    def draw():
        mutation_plugin.pytest_configure(None)
        bar(range(2), file=io.StringIO()).close()
    assert child(draw) == 0, "the second child hung on the first child's lock"
