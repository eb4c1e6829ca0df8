"""The pytest plugin behind `specgate gates run` (or `pytest -p gates.plugin gates/<gate>.py`).

It maps each test to its gate by module file, and gathers per gate: every test's outcome, the
cases the tests declared through the `gate_record` fixture, the evidence behind a failed check,
measurements, and which claimed situations occurred. At the end it decides each gate's status
(gates/report.py), prints a table, writes the results to --gates-report, and fails the session
when a gate is red or errored, also one whose tests all passed (zero cases, a claim that never
occurred).

Over 300 lines because the options, the per-gate record and the hooks that judge and report it
share one session's state, which pytest hands to a plugin module.
"""
import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from engine.config import ARMS, FORWARDS
from gates import report as verdicts
from gates.argtypes import choice_list
from gates.provenance import judged, model_shape
from gates.registry import GATES, Gate, gate_of_file, has_cuda
from gates.workloads import drafter_skips

SESSION_PLUGIN = "specgate-gate-session"
REFERENCE, COMPILED = FORWARDS
# The model folders the gates use when neither an option nor the environment names one. The layer
# that knows the fixture models (the root conftest.py) puts them here; the gates import no fixtures.
DEFAULT_MODELS = pytest.StashKey[dict[str, Path]]()


def pytest_addoption(parser):
    group = parser.getgroup("specgate gates")
    group.addoption("--model", default=None, help="target model folder (default: $SPECGATE_MODEL, "
                    "else the fixture target)")
    group.addoption("--drafter", default=None, help="block drafter folder (default: $SPECGATE_DRAFTER, "
                    "else the fixture drafter)")
    group.addoption("--device", default=None, help="device the gates run the engine on (default: "
                    "$SPECGATE_DEVICE, else cpu)")
    group.addoption("--dtype", default=None, help="dtype the gates run the engine in (default: $SPECGATE_DTYPE, "
                    "else the model folder's own)")
    group.addoption("--busy-threshold", default=None, help="busy gate: the busy fraction the async runner's "
                    "graph arm must reach without the profiler, and the sync runner's must not (default: "
                    "$SPECGATE_BUSY_THRESHOLD, else 0.95, see gates/busy.py)")
    group.addoption("--forwards", default=None, help="forwards the gates judge, comma-separated: reference, "
                    "compiled (default: $SPECGATE_FORWARDS, else both with a cuda --device, the reference on the "
                    "CPU, both on the CPU under the deep profile; see gates/conftest.py for what each runs)")
    group.addoption("--timed-arms", default=None, help="the arms the timed gates (busy, speed-ab) measure, "
                    "comma-separated: eager, graph (default: $SPECGATE_TIMED_ARMS, else both). The verdict judges "
                    "the graph arm; `--timed-arms graph` leaves out the eager legs, reported and not judged")
    group.addoption("--gates-report", default=None, help="write the gates' results here (JSON)")
    group.addoption("--gates-spec", default=None, help="JSON list of gate definitions to use instead "
                    "of the registry (tests of the harness)")
    group.addoption("--gates-no-table", action="store_true", help="print no gate table at the end: the "
                    "caller prints its own (specgate gates run), so the table is not shown twice")
    group.addoption("--gates-stop-at-red", action="store_true", help="skip a gate's remaining tests once one "
                    "of its checks failed: the gate is red whatever they give (prove's defect trees)")
    group.addoption("--gates-per-test", action="store_true", help="only each test's own outcome sets the "
                    "exit status, not the gates' verdicts: a mutation run selects a few tests of a gate, "
                    "and a claim another test covers would read as red")


def pytest_configure(config):
    gates = GATES
    if config.getoption("--gates-spec"):
        raw = json.loads(Path(config.getoption("--gates-spec")).read_text())
        gates = tuple(Gate(**{**g, "path": Path(g["path"]) if g.get("path") else None}) for g in raw)
    config.addinivalue_line("markers", "forwards(*names): the test runs these forwards itself (compile=...): "
                            "collected only when the session judges every one of them")
    config.pluginmanager.register(GateSession(config, gates), SESSION_PLUGIN)


def judged_forwards(config) -> tuple[str, ...]:
    """The forwards the session judges: --forwards / $SPECGATE_FORWARDS, else both on a cuda device
    (where the compiled forward is what users run) and the reference one on the CPU (inductor's CPU
    compile costs 30-150 s an engine on two cores), both under the deep profile there."""
    given = option(config, "--forwards", "SPECGATE_FORWARDS")
    if given:
        try:
            return choice_list(*FORWARDS)(given)
        except argparse.ArgumentTypeError as e:
            raise pytest.UsageError(f"--forwards: {e}") from None
    on_cuda = (option(config, "--device", "SPECGATE_DEVICE") or "cpu").startswith("cuda")
    deep = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
    return FORWARDS if on_cuda or deep else (REFERENCE,)


def timed_arms(config) -> tuple[str, ...]:
    """The arms the timed gates measure: --timed-arms / $SPECGATE_TIMED_ARMS, else both."""
    given = option(config, "--timed-arms", "SPECGATE_TIMED_ARMS")
    try:
        return choice_list(*ARMS)(given) if given else ARMS
    except argparse.ArgumentTypeError as e:
        raise pytest.UsageError(f"--timed-arms: {e}") from None


def arm_of(item) -> str | None:
    """The arm a test item runs, from its parameters (`graph_arm`, or a `graph` flag), if it has one."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if "graph_arm" in params:
        return params["graph_arm"]
    if isinstance(params.get("graph"), bool):
        return ARMS[params["graph"]]
    return None


def axis_forwards(config) -> tuple[str, ...]:
    """The values of the `forward` axis of a forward-dependent gate's engine-building tests: the
    judged forwards on a cuda device; on the CPU the reference alone, whatever is judged (a compiled
    axis would compile for hours there): the compiled forward is then judged by the tests marked
    forwards(...), which run both forwards themselves."""
    on_cuda = (option(config, "--device", "SPECGATE_DEVICE") or "cpu").startswith("cuda")
    return judged_forwards(config) if on_cuda else (REFERENCE,)


@pytest.fixture(scope="session")
def gate_record(request) -> "Recorder":
    """Declare the running gate test's cases, occurrences, evidence and measurements."""
    return Recorder(request.config.pluginmanager.get_plugin(SESSION_PLUGIN))


class Recorder:
    """Session-scoped (Hypothesis refuses function-scoped fixtures); writes to the running test."""

    def __init__(self, session: "GateSession"):
        self._session = session

    def case(self, **params) -> None:
        """Start a case: one engine run or comparison the gate checks. Evidence recorded from
        here on belongs to it (for Hypothesis, the failing example is the last case run)."""
        test = self._session.current_test()
        axis = self._session.axis_param()
        test["cases"].append(_jsonable(params if axis is None else {"forward": axis, **params}))
        test["evidence"] = []

    def occurred(self, claim: str, condition: bool = True) -> None:
        """Mark a situation the gate claims to cover (its module's CLAIMS) as having happened."""
        if condition:
            self._session.current_claims().add(claim)

    def unexercisable(self, claim: str, proof: str) -> None:
        """The target provably cannot make `claim` happen (`proof` says why, from this run's
        own records): the claim is not demanded and the report lists it with the proof under
        `waived_claims`, as for a drafter unfit for the target. Never for the fixture models'
        claims by assumption: call it only where the proof is computed."""
        self._session.unexercisable[self._session.gate_of(self._session.current_item.path).name][claim] = proof

    def model(self, folder, name: str | None = None) -> None:
        """The running gate's engines run on `folder`, a model of its own (as depth's deep folder),
        not the session's target: the report names it in the gate's `models` (its name, folder and
        shape keys), since the environment's `model` and `model_shape` describe the target."""
        gate = self._session.gate_of(self._session.current_item.path).name
        self._session.models_run[gate][str(folder)] = {"name": name or Path(folder).name, "folder": str(folder),
                                                       "model_shape": model_shape(folder)}

    def evidence(self, **data) -> None:
        """Attach evidence to the current case; the report shows it when the test fails."""
        self._session.current_test()["evidence"].append(_jsonable(data))

    def check(self, difference, context: str = "") -> None:
        """Fail with the difference (a gates.compare.Difference) as evidence, if there is one."""
        if difference is None:
            return
        self.evidence(**difference.as_dict(), **({"context": context} if context else {}))
        pytest.fail(f"{context + ': ' if context else ''}{difference}", pytrace=False)

    def measure(self, **figures) -> None:
        """Record figures (timings, p-values) for the report, whatever the outcome."""
        self._session.current_test()["measurements"].append(_jsonable(figures))


class GateSession:
    def __init__(self, config, gates):
        self.config = config
        self.gates = gates
        self.tests: dict[str, dict[str, dict]] = {g.name: {} for g in gates}
        self.claims: dict[str, set[str]] = {g.name: set() for g in gates}
        self.unexercisable: dict[str, dict[str, str]] = {g.name: {} for g in gates}  # claim -> proof
        # Forwards: what each gate's collected tests ask for (the axis, the forwards(...) marker)
        # and what its engines ran; each forward asked for is a claim ("compiled forward").
        self.forwards_asked: dict[str, set[str]] = {g.name: set() for g in gates}
        self.forwards_run: dict[str, set[str]] = {g.name: set() for g in gates}
        self.backends_run: dict[str, set[str]] = {g.name: set() for g in gates}  # attention backends, likewise
        self.models_run: dict[str, dict[str, dict]] = {g.name: {} for g in gates}  # folder -> Recorder.model's record
        # A timed gate's arms left out by --timed-arms: their claims are waived, saying why.
        self.arms_left_out: dict[str, dict[str, str]] = {g.name: {} for g in gates}  # claim -> why
        self.declared_claims: dict[str, tuple[str, ...]] = {}
        self.collect_errors: dict[str, str] = {}
        self.current_item = None
        self.results: list[verdicts.GateResult] = []
        self._gate_by_path: dict[Path, Gate | None] = {}
        self._loose = _new_test("")  # a gate_record call from a test that belongs to no gate
        self._skipped_drafters: dict[str, str] | None = None

    def skipped_drafters(self) -> dict[str, str]:
        """Drafters that cannot run on this session's target, with the reason (decided once)."""
        if self._skipped_drafters is None:
            self._skipped_drafters = drafter_skips(model_dir(self.config, "target"), model_dir(self.config, "drafter"))
        return self._skipped_drafters

    def gate_of(self, path) -> Gate | None:
        path = Path(path)
        if path not in self._gate_by_path:
            self._gate_by_path[path] = gate_of_file(path, self.gates)
        return self._gate_by_path[path]

    def _test_of(self, item) -> dict:
        gate = self.gate_of(item.path) if item is not None else None
        if gate is None:
            return self._loose
        return self.tests[gate.name].setdefault(item.nodeid, _new_test(item.nodeid))

    def current_test(self) -> dict:
        return self._test_of(self.current_item)

    def axis_param(self) -> str | None:
        """The running test's `forward` parameter, None when it has none."""
        callspec = getattr(self.current_item, "callspec", None)
        return callspec.params.get("forward") if callspec is not None else None

    def current_forward(self) -> str:
        """The forward a gate's engine runs unless the test says (compile=...): the test's axis
        value, else the reference forward."""
        return self.axis_param() or REFERENCE

    def build_engine(self, factory, judged: bool = True, **kwargs):
        """factory(**kwargs) (an LLM) on the running test's forward unless compile= is given. Its
        forward counts as judged by the running gate (the report's `forwards`, the claim
        "<forward> forward"), and its attention backend too (`attention_backends`), unless
        judged=False: an engine the gate uses but does not judge."""
        kwargs.setdefault("compile", self.current_forward() == COMPILED)
        llm = factory(**kwargs)
        gate = self.gate_of(self.current_item.path) if self.current_item is not None else None
        if gate is not None and judged:
            self.forwards_run[gate.name].add(llm.config.forward)
            self.backends_run[gate.name].add(llm.config.attention_backend)
            self.claims[gate.name].add(f"{llm.config.forward} forward")
        return llm

    def current_claims(self) -> set[str]:
        gate = self.gate_of(self.current_item.path) if self.current_item is not None else None
        return self.claims[gate.name] if gate else set()

    # ---- hooks --------------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, config, items):
        """Tests marked forwards(...) run only when the session judges each of those forwards; the
        forwards every kept test asks for become its gate's claims. A timed gate's tests of an arm
        --timed-arms leaves out are deselected, and that arm's claim waived with the reason."""
        judged, arms = set(judged_forwards(config)), timed_arms(config)
        kept, dropped = [], []
        for item in items:
            marker = item.get_closest_marker("forwards")
            asked = set(marker.args) if marker else set()
            gate = self.gate_of(item.path)
            arm = arm_of(item) if gate is not None and gate.timed else None
            if arm is not None and arm not in arms:
                self.arms_left_out[gate.name][f"{arm} arm"] = f"not measured: --timed-arms {','.join(arms)}"
            if not asked <= judged or (arm is not None and arm not in arms):
                dropped.append(item)
                continue
            kept.append(item)
            callspec = getattr(item, "callspec", None)
            param = callspec.params.get("forward") if callspec is not None else None
            if gate is not None:
                self.forwards_asked[gate.name] |= asked | ({param} if param else set())
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def pytest_collectreport(self, report):
        gate = self.gate_of(report.fspath) if report.fspath else None
        if gate is not None and report.failed:
            self.collect_errors[gate.name] = str(report.longrepr)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current_item = item
        gate = self.gate_of(item.path)
        if gate is not None:
            self.declared_claims[gate.name] = tuple(getattr(item.module, "CLAIMS", ()))
            self._test_of(item)
            _coverage_context(gate.name)
        try:
            return (yield)
        finally:
            self.current_item = None
            if gate is not None and (nextitem is None or self.gate_of(nextitem.path) is not gate):
                self._gate_done(gate)

    @pytest.hookimpl(tryfirst=True)  # before the fixtures: a skipped test builds no engine
    def pytest_runtest_setup(self, item):
        gate = self.gate_of(item.path)
        if (gate is not None and self.config.getoption("--gates-stop-at-red")
                and any(t["outcome"] == verdicts.FAILED for t in self.tests[gate.name].values())):
            pytest.skip(f"gate {gate.name} is red already (--gates-stop-at-red)")

    def _gate_done(self, gate: Gate) -> None:
        """One line per finished gate, so a long run shows progress also when not on a terminal."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            r = self.gate_result(gate)
            reporter.write("\n")  # after pytest's progress dots
            reporter.write_line(f"specgate: gate {gate.name} {r.status} ({r.num_cases} cases, "
                                f"{r.seconds:.0f} s): {r.reason}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        if self.gate_of(item.path) is None:
            return rep
        test = self._test_of(item)
        test["seconds"] += rep.duration
        if rep.skipped and test["outcome"] == verdicts.PASSED:
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
            test["outcome"], test["message"] = verdicts.SKIPPED, reason.removeprefix("Skipped: ")
        elif rep.failed and test["outcome"] != verdicts.FAILED:
            is_check = rep.when == "call" and call.excinfo is not None and _is_failed_check(call.excinfo.value)
            test["outcome"] = verdicts.FAILED if is_check else verdicts.ERROR
            test["message"] = (f"[{rep.when}] " if rep.when != "call" else "") + _message(rep, call)
        return rep

    def pytest_sessionfinish(self, session, exitstatus):
        asked = {Path(a.split("::")[0]).resolve() for a in session.config.args}
        selected = [g for g in self.gates if self.tests[g.name] or g.name in self.collect_errors
                    or g.file.resolve() in asked]
        self.results = [self.gate_result(g) for g in selected]
        judged = not self.config.getoption("--gates-per-test")
        if judged and verdicts.exit_status(self.results) and selected and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        path = self.config.getoption("--gates-report")
        if path:
            report = verdicts.GateReport(self.results, environment(self.config))
            Path(path).write_text(json.dumps(report.to_json(), indent=2, default=str))

    def pytest_terminal_summary(self, terminalreporter):
        if self.results and not self.config.getoption("--gates-no-table"):
            terminalreporter.write_sep("=", "specgate gates")
            terminalreporter.write_line(verdicts.table(self.results))

    def gate_result(self, gate: Gate) -> verdicts.GateResult:
        tests = list(self.tests[gate.name].values())
        asked = tuple(f"{f} forward" for f in FORWARDS if f in self.forwards_asked[gate.name])
        claims, seen = self.declared_claims.get(gate.name, ()) + asked, self.claims[gate.name]
        # A claim about a drafter the gates skip on this target (the drafter's name, or a claim
        # starting "<drafter> drafter ...") is not demanded; why is reported.
        waived = {c: why for d, why in self.skipped_drafters().items() for c in claims
                  if c == d or c.startswith(f"{d} drafter ")} if tests else {}
        waived |= {c: proof for c, proof in self.unexercisable[gate.name].items() if c not in seen}
        waived |= {c: why for c, why in self.arms_left_out[gate.name].items() if c in claims and c not in seen}
        status, reason = verdicts.gate_status(gate.needs, tests, claims, seen, self.collect_errors.get(gate.name),
                                          has_cuda(), waived)
        evidence = [{"test": t["nodeid"], "message": t["message"], "case": t["cases"][-1] if t["cases"] else None,
                     "differences": t["evidence"]}
                    for t in tests if t["outcome"] in (verdicts.FAILED, verdicts.ERROR)]
        if status in (verdicts.RED, verdicts.ERROR) and not evidence:
            evidence.append({"message": reason})
        return verdicts.GateResult(
            name=gate.name, purpose=gate.purpose, needs=gate.needs, module=str(gate.file), status=status, reason=reason,
            num_cases=sum(len(t["cases"]) for t in tests),
            cases=[{"test": t["nodeid"].split("::", 1)[-1], **c} for t in tests for c in t["cases"]],
            evidence=evidence, measurements=[m for t in tests for m in t["measurements"]],
            claims={c: c in seen for c in claims}, waived_claims=waived,
            forwards=[f for f in FORWARDS if f in self.forwards_run[gate.name]],
            attention_backends=sorted(self.backends_run[gate.name]),
            models=list(self.models_run[gate.name].values()),
            tests=[verdicts.TestRecord(t["nodeid"], t["outcome"], t["message"], round(t["seconds"], 3), len(t["cases"]))
                   for t in tests],
            seconds=round(sum(t["seconds"] for t in tests), 3))


def _coverage_context(name: str) -> None:
    """Under `gates run --coverage` (gates/reach.py), what runs next counts for gate `name`."""
    if os.environ.get("SPECGATE_COVERAGE"):
        import coverage
        cov = coverage.Coverage.current()
        if cov is not None:
            cov.switch_context(name)


def _new_test(nodeid: str) -> dict:
    return {"nodeid": nodeid, "outcome": verdicts.PASSED, "message": None, "seconds": 0.0,
            "cases": [], "evidence": [], "measurements": []}


def _is_failed_check(exc: BaseException) -> bool:
    """A failed assertion or pytest.fail is a check saying no; anything else could not decide.
    Hypothesis may report several distinct failures as one group."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_failed_check(e) for e in exc.exceptions)
    return isinstance(exc, (AssertionError, pytest.fail.Exception))


def _message(rep, call) -> str:
    if call.excinfo is not None and rep.when == "call":
        exc = call.excinfo.value
        return str(exc.msg) if isinstance(exc, pytest.fail.Exception) else f"{type(exc).__name__}: {exc}"
    return rep.longreprtext.strip().splitlines()[-1] if rep.longreprtext else ""


def model_dir(config, which: str) -> Path | None:
    """The "target" or "drafter" folder the gates use: --model/--drafter, else $SPECGATE_MODEL/
    $SPECGATE_DRAFTER, else the default handed down in DEFAULT_MODELS (None without one)."""
    flag, env = {"target": ("--model", "SPECGATE_MODEL"), "drafter": ("--drafter", "SPECGATE_DRAFTER")}[which]
    given = option(config, flag, env)
    return Path(given) if given else config.stash.get(DEFAULT_MODELS, {}).get(which)


def option(config, name: str, env: str) -> str | None:
    """A gate option: the pytest option, else the environment variable, else None."""
    try:
        value = config.getoption(name)
    except ValueError:  # run without this plugin
        value = None
    return value or os.environ.get(env) or None


def environment(config) -> dict:
    import platform

    import torch

    from engine.loader import model_checksums
    model, drafter = option(config, "--model", "SPECGATE_MODEL"), option(config, "--drafter", "SPECGATE_DRAFTER")
    try:
        target_dir = model_dir(config, "target")
        if target_dir is None:
            raise OSError("no target model folder: no --model, no $SPECGATE_MODEL, and no default handed down")
        checksums = model_checksums(target_dir, model_dir(config, "drafter"))
    except OSError as e:
        checksums = {"error": str(e)}
    target, draft = model_dir(config, "target"), model_dir(config, "drafter")
    device = option(config, "--device", "SPECGATE_DEVICE") or "cpu"
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": has_cuda(),
            "device": device,
            "dtype": option(config, "--dtype", "SPECGATE_DTYPE") or "the model folder's",
            # The folders used, given or default; model_given says whether --model/$SPECGATE_MODEL named one.
            "model": str(target) if target else None, "drafter": str(draft) if draft else None,
            "model_given": model is not None, "drafter_given": drafter is not None, "model_sha256": checksums,
            "hypothesis_profile": os.environ.get("HYPOTHESIS_PROFILE", "ci"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads(),
            "timed_arms": list(timed_arms(config)),
            **judged(device, target, judged_forwards(config))}


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "__dataclass_fields__"):
        return _jsonable(asdict(value))
    return str(value)
