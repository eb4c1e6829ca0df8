"""`specgate bench`'s passes on stand-in engines and a stand-in clock: the progress bar over the
legs (run_bench, run_oracle_bench), the oracle bench's plain pass, the plain run its script
replays (oracle_script) and the oracle pass, and the oracle report's comparison of the two
(oracle_report) on legs written by hand."""
import re
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from engine.bench import legs as bench
from engine.bench.legs import Leg
from engine.bench.metrics import Acceptance
from engine.bench.oracle import OracleScript
from engine.bench.workload import Workload
from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.sampling import SamplingParams
from helpers.clock import Clock

WORKLOAD = Workload(("ab", "cde"), max_tokens=(4, 6), arrival_steps=(0, 2))


class Engine:
    """A stand-in LLM: a generate call takes 0.5 s on the clock and returns, per prompt, its bytes
    as the prompt's ids and max_tokens tokens 7; every call is recorded."""

    def __init__(self, clock: Clock, spec: str | None = None):
        self.time, self.calls = clock, []
        self.config = SimpleNamespace(spec=spec, model="/models/target")
        self.runner = SimpleNamespace(is_cuda=False)

    def generate(self, prompts, params, arrival_steps=None):
        self.calls.append((prompts, params, arrival_steps))
        self.time.perf += 0.5
        return [RequestOutput(i, p, list(p.encode()), [7] * sp.max_tokens, "", "length", RequestStats())
                for i, (p, sp) in enumerate(zip(prompts, params))]


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(bench, "time", clock)
    return clock


def oracle_bench(clock: Clock, progress: bool, on_leg=None) -> tuple:
    """run_oracle_bench at c=1 and c=4, 2 legs (1 warm-up), tau 2.5, k 3: (plain, oracle, engines
    built as (c, script, engine))."""
    built = []

    def make_llm(c, script):
        built.append((c, script, Engine(clock, "oracle" if script else None)))
        return built[-1][2]
    plain, oracle = bench.run_oracle_bench(make_llm, WORKLOAD, [1, 4], 2, 1, tau=2.5, k=3, progress=progress,
                                           on_leg=on_leg)
    return plain, oracle, built


def frames(err: str) -> list[tuple[str, str]]:
    """Each redraw of the progress bar: (its description, done/total); each counts legs."""
    out = []
    for frame in filter(None, err.split("\r")):
        m = re.fullmatch(r"(?:(.*): )?\s*\d+%\|[^|]*\| (\d+/\d+) \[[^\]]*leg/s\]\s*", frame)
        assert m, repr(frame)
        out.append((m[1] or "", m[2]))
    return out


def descriptions(shown: list[tuple[str, str]]) -> list[str]:
    """The descriptions in the order shown, each once (a slow leg may be redrawn mid-way)."""
    return [d for i, (d, _) in enumerate(shown) if i == 0 or shown[i - 1][0] != d]


def test_the_bench_bar_names_each_leg_as_it_runs_and_ends_at_every_leg(clock, capsys):
    bench.run_bench(lambda c: Engine(clock), WORKLOAD, [1, 8], 2, 1, progress=True)
    shown = frames(capsys.readouterr().err)
    assert descriptions(shown) == ["", "c=1 leg 0", "c=1 leg 1", "c=8 leg 0", "c=8 leg 1"]
    assert shown[0][1] == "0/4" and shown[-1] == ("c=8 leg 1", "4/4")


def test_the_oracle_bench_bar_names_the_pass_of_each_leg_and_counts_both_passes(clock, capsys):
    oracle_bench(clock, progress=True)
    shown = frames(capsys.readouterr().err)
    assert descriptions(shown) == ["", *(f"{p} c={c} leg {i}" for c in (1, 4) for p in ("plain", "oracle")
                                        for i in (0, 1))]
    assert shown[0][1] == "0/8" and shown[-1] == ("oracle c=4 leg 1", "8/8")


def test_without_progress_neither_bench_writes_anything(clock, capsys):
    bench.run_bench(lambda c: Engine(clock), WORKLOAD, [1], 2, 1, progress=False)
    oracle_bench(clock, progress=False)
    assert capsys.readouterr().err == ""


def test_the_oracle_bench_runs_plain_legs_then_the_plain_script_run_then_oracle_legs_per_concurrency(clock):
    seen = []
    plain, oracle, built = oracle_bench(clock, progress=False, on_leg=seen.append)
    assert [(leg.spec, leg.concurrency, leg.index, leg.warm) for leg in plain + oracle] == [
        (spec, c, i, i == 1) for spec in (None, "oracle") for c in (1, 4) for i in (0, 1)]
    assert seen == plain[:2] + oracle[:2] + plain[2:] + oracle[2:]  # on_leg after every leg of both passes
    script = OracleScript(2.5, {(97, 98): (7,) * 7, (99, 100, 101): (7,) * 9}, model="/models/target")
    assert [(c, s) for c, s, _ in built] == [(1, None), (1, script), (4, None), (4, script)]
    # The plain engine's third call is the run the script holds: the legs' prompts and arrivals,
    # greedy, EOS ignored, k more tokens each.
    params = [SamplingParams(temperature=0.0, max_tokens=m + 3, ignore_eos=True) for m in (4, 6)]
    for _, _, engine in built[::2]:
        assert len(engine.calls) == 3 and engine.calls[2] == (["ab", "cde"], params, [0, 2])


def leg(c: int, i: int, tps: float, warm: bool, sha: str = "same", accepted: int = 6) -> Leg:
    acc = Acceptance(num_requests=1, completion_tokens=8, verify_steps=4, num_drafts=4, num_draft_tokens=12,
                     num_accepted_tokens=accepted).as_dict()
    return Leg(c, i, 3, 8, 0.0, 1.0, 1.0, tps, acc, warm, tokens_sha=sha)


def test_the_oracle_report_compares_each_concurrency_with_its_plain_pass():
    """Speed-up: the warm means' ratio to three digits, none where either pass has no warm leg;
    lossless: every leg of both passes emitted the same tokens."""
    plain = [leg(1, 0, 9.0, False), leg(1, 1, 30.0, True), leg(2, 1, 40.0, True),
             leg(4, 1, 50.0, True), leg(8, 0, 50.0, False)]
    oracle = [leg(1, 0, 70.0, False), leg(1, 1, 100.0, True), leg(2, 1, 60.0, True, sha="other"),
              leg(4, 0, 80.0, False), leg(8, 1, 90.0, True, accepted=2)]
    meta = {"spec": "oracle", "oracle_tau": 2.5}
    out = bench.oracle_report(plain, oracle, WORKLOAD, meta)
    assert out["oracle_vs_plain"] == {"1": {"speedup": 3.333, "tau": 2.5, "lossless": True},
                                      "2": {"speedup": 1.5, "tau": 2.5, "lossless": False},
                                      "4": {"speedup": None, "tau": 1.0, "lossless": True},
                                      "8": {"speedup": None, "tau": 1.5, "lossless": True}}
    assert out["plain"] == {"legs": [asdict(x) for x in plain], "summary": bench.fold(plain)}
    assert {k: v for k, v in out.items()
            if k not in ("plain", "oracle_vs_plain")} == bench.report(oracle, WORKLOAD, meta)
