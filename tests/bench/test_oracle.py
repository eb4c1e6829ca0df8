"""The oracle proposer (benchmarks only): it replays the plain run's greedy tokens, so the tokens
are the plain run's; it hits the asked mean acceptance length τ; and the engine refuses it
without a script, with a τ it cannot hit, and for prompts the script does not hold.

The τ check is statistical. The statistic: τ̂ = 1 + accepted / drafts (engine/bench/metrics.py), the
mean over the N verify steps of T = tokens emitted in the step. Every step drafts k tokens
(the script holds max_tokens + k of each continuation) and looks at positions no earlier step
looked at, each corrupted independently with probability 1 - a, so the T are independent draws
of a truncated geometric law with mean τ and standard deviation σ_T
(engine/bench/oracle.py:tokens_per_step_moments). Test: a two-sided z-test on the mean (central limit),
|τ̂ - τ| <= Z·σ_T/√N with Z = 4 (false alarm about 6e-5). Negative control: a run asking for a τ
one token higher lands outside the same band."""
import pytest

from conftest import TensorCopies  # tests/conftest.py
from engine import SamplingParams
from engine.bench.legs import oracle_script
from engine.bench.metrics import Acceptance
from engine.bench.oracle import OracleScript, acceptance_for_tau, oracle_proposer, tokens_per_step_moments
from engine.bench.workload import Workload
from engine.errors import RequestError, SpecgateError

K = 4
Z = 4.0


@pytest.fixture(scope="module")
def workload(corpus):
    from engine.bench.legs import heldout_workload
    prompts = heldout_workload(corpus, 8, prompt_chars=60, max_tokens=1).prompts
    return Workload(prompts, max_tokens=(96, 40, 120, 64, 100, 24, 88, 110),
                    arrival_steps=(0, 0, 2, 5, 0, 9, 3, 1))


@pytest.fixture(scope="module")
def plain(make_llm, workload):
    """The plain run's outputs and a script-builder from the same plain engine."""
    llm = make_llm(max_num_seqs=4)
    outs = llm.generate(workload.prompt_list(), workload.params(ignore_eos=True),
                        arrival_steps=workload.arrivals())
    return llm, [o.token_ids for o in outs]


def run_oracle(make_llm, workload, plain, tau, **kwargs):
    llm, _ = plain
    kwargs.setdefault("max_num_seqs", 4)
    oracle = make_llm(spec="oracle", num_spec_tokens=K, proposer=oracle_proposer(oracle_script(llm, workload, K, tau)),
                      **kwargs)
    outs = oracle.generate(workload.prompt_list(), workload.params(ignore_eos=True),
                           arrival_steps=workload.arrivals())
    acc = Acceptance()
    for o in outs:
        acc.add(o.stats, len(o.token_ids))
    return [o.token_ids for o in outs], acc, outs


@pytest.mark.parametrize("tau, runner", [(2.5, dict(async_runner=False)), (4.3, dict(async_runner=True)),
                                         (2.5, dict(async_runner=True, graph=True, max_num_seqs=3))],
                         ids=["sync", "async", "async-graph"])
def test_oracle_tokens_are_the_plain_runs(make_llm, workload, plain, tau, runner):
    tokens, acc, _ = run_oracle(make_llm, workload, plain, tau, **runner)
    assert tokens == plain[1]
    assert acc.num_requests == 8 and acc.num_drafts > 8


def test_tau_k_plus_one_accepts_every_draft(make_llm, workload, plain):
    _, acc, _ = run_oracle(make_llm, workload, plain, K + 1.0)
    assert acc.num_draft_tokens == K * acc.num_drafts  # every verify step drafted k tokens
    assert acc.num_accepted_tokens == acc.num_draft_tokens and acc.mean_acceptance_length == K + 1


def test_tau_one_accepts_no_draft(make_llm, workload, plain):
    _, acc, _ = run_oracle(make_llm, workload, plain, 1.0)
    assert acc.num_drafts > 0 and acc.num_accepted_tokens == 0


def within_band(acc: Acceptance, tau: float) -> tuple[bool, float]:
    mean, var = tokens_per_step_moments(acceptance_for_tau(tau, K), K)
    half = Z * (var / acc.num_drafts) ** 0.5
    return abs(acc.mean_acceptance_length - tau) <= half, half


def test_measured_tau_hits_the_asked_one_and_a_higher_one_does_not(make_llm, workload, plain):
    _, acc, _ = run_oracle(make_llm, workload, plain, 2.5)
    assert acc.num_draft_tokens == K * acc.num_drafts and acc.num_drafts >= 200
    ok, half = within_band(acc, 2.5)
    assert ok, f"τ̂ {acc.mean_acceptance_length:.3f} outside 2.5 ± {half:.3f} over {acc.num_drafts} steps"
    assert half < 0.5
    _, higher, _ = run_oracle(make_llm, workload, plain, 3.5)
    assert within_band(higher, 3.5)[0]
    assert not within_band(higher, 2.5)[0], "negative control: a τ of 3.5 must fall outside 2.5's band"


def test_corruption_is_keyed_by_position_not_by_step(make_llm, workload, plain):
    """Each request's accepted drafts are the same whatever the batching and the runner."""
    _, _, one = run_oracle(make_llm, workload, plain, 2.5, max_num_seqs=1, async_runner=False)
    _, _, many = run_oracle(make_llm, workload, plain, 2.5, max_num_seqs=4, async_runner=True)
    assert [o.stats.accepted_per_position for o in one] == [o.stats.accepted_per_position for o in many]
    assert len({tuple(o.stats.accepted_per_position) for o in one}) > 1  # requests draw their own coins


def test_acceptance_solves_the_geometric_sum():
    for tau in (1.0, 1.7, 2.5, 4.3, 5.0):
        a = acceptance_for_tau(tau, K)
        assert 0 <= a <= 1 and abs(sum(a ** i for i in range(K + 1)) - tau) < 1e-9
        assert abs(tokens_per_step_moments(a, K)[0] - tau) < 1e-9


@pytest.mark.parametrize("tau", [0.99, K + 1.01, 0.0, 7.0])
def test_tau_outside_one_to_k_plus_one_is_refused(make_llm, tau):
    with pytest.raises(SpecgateError, match=r"\[1, k\+1\]"):
        make_llm(spec="oracle", num_spec_tokens=K, proposer=oracle_proposer(OracleScript(tau, {})))


def test_oracle_outside_the_bench_is_refused(make_llm, target_dir):
    with pytest.raises(SpecgateError, match="benchmarks only.*oracle_proposer"):
        make_llm(spec="oracle")
    with pytest.raises(SpecgateError, match="only with spec='oracle'"):
        make_llm(spec="ngram", proposer=oracle_proposer(OracleScript(2.0, {})))
    with pytest.raises(SpecgateError, match="plain run of /elsewhere"):
        make_llm(spec="oracle", proposer=oracle_proposer(OracleScript(2.0, {}, model="/elsewhere")))


def test_prompts_the_script_cannot_replay_are_refused(make_llm):
    script = OracleScript(2.5, {(10, 11, 12): tuple(range(20, 40))})
    llm = make_llm(spec="oracle", num_spec_tokens=K, proposer=oracle_proposer(script))
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    with pytest.raises(RequestError, match="not in the oracle script"):
        llm.generate([[10, 11, 12], [10, 11, 13]], greedy)
    with pytest.raises(RequestError, match="needs 21"):
        llm.generate([10, 11, 12], SamplingParams(temperature=0.0, max_tokens=17))
    with pytest.raises(RequestError, match="temperature must be 0"):
        llm.generate([10, 11, 12], SamplingParams(temperature=0.8, max_tokens=8))
    assert not llm.has_unfinished()
    assert llm.generate([10, 11, 12], greedy)[0].finish_reason == "length"


@pytest.mark.parametrize("argv, words", [
    (["bench", "--spec", "oracle"], ["--spec oracle needs --oracle-tau"]),
    (["bench", "--oracle-tau", "2"], ["only with --spec oracle"]),
    (["bench", "--spec", "oracle", "--oracle-tau", "5.5", "--num-spec-tokens", "4"], ["[1, 5]", "5.5"]),
    (["bench", "--spec", "oracle", "--oracle-tau", "0.5"], ["--oracle-tau", ">= 1.0"]),
    (["bench", "--spec", "oracle", "--oracle-tau", "2", "--temperature", "0.7"], ["--temperature must be 0"]),
    (["generate", "--prompt", "x", "--spec", "oracle"], ["benchmarks only"]),
])
def test_the_command_refuses_oracle_misuse_in_one_line(capsys, argv, words):
    from specgate_cli import main
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("specgate: error: "), err
    for word in words:
        assert word in err[0], err[0]


def test_bench_runs_the_plain_pass_then_the_oracle_pass(tmp_path, capsys):
    """At tau = k+1 every draft is accepted, so τ is exactly k+1; the oracle legs' tokens are the
    plain legs'; every leg carries its host phases; --count-kernels adds aten ops per step (CPU),
    over its default window of 8 decode steps."""
    import json

    from specgate_cli import main
    out = tmp_path / "bench.json"
    assert main(["bench", "--spec", "oracle", "--oracle-tau", "3", "--num-spec-tokens", "2", "--concurrency", "2",
                 "--legs", "2", "--num-prompts", "2", "--max-tokens", "12", "--max-model-len", "256",
                 "--count-kernels", "--json", str(out), "--plot", str(tmp_path / "bench.png")]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [leg["spec"] for leg in result["plain"]["legs"]] == [None, None]
    assert [leg["spec"] for leg in result["legs"]] == ["oracle", "oracle"]
    assert result["oracle_vs_plain"]["2"]["lossless"] and result["oracle_vs_plain"]["2"]["tau"] == 3.0
    assert result["summary"]["2"]["acceptance"]["num_drafts"] > 2 and result["oracle_tau"] == 3.0
    for summary in (result["summary"]["2"], result["plain"]["summary"]["2"]):
        assert summary["phases"]["steps"] > 0 and summary["phases"]["gpu_ms_per_step"] is None
    assert result["kernels"]["2"]["aten_ops_per_step"] > 10 and "aten" in result["kernels"]["2"]["counted"]
    # 12 tokens leave 9 decode steps past the warm-up one: the default window of 8 binds.
    assert result["kernels"]["2"]["steps"] == 8 and "(eager arm, 8 steps)" in printed
    assert "oracle over plain" in printed and "tokens equal the plain run's" in printed
    assert "host ms/step: plan" in printed and "aten ops" in printed
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG" and result["figures"]["2"]["tau_fold"] == 3.0


def test_a_preempted_request_replays_from_its_new_slot(make_llm, workload, plain):
    """A preempted request is prefilled again, maybe in another slot: admission writes its
    continuation there again, and the tokens stay the plain run's."""
    tokens, acc, outs = run_oracle(make_llm, workload, plain, 3.0, num_kv_blocks=24, async_runner=True)
    assert sum(o.stats.num_preemptions for o in outs) > 0
    assert tokens == plain[1] and acc.num_accepted_tokens > 0


def test_two_requests_with_one_prompt_draw_their_own_coins(make_llm, workload, plain):
    """The corruption is keyed by each request's own key (its seed, or the engine seed's draw for
    it), not by its prompt alone: the same prompt twice is corrupted at other positions."""
    llm, _ = plain
    twice = Workload((workload.prompts[0],) * 2, max_tokens=(96, 96))
    oracle = make_llm(spec="oracle", num_spec_tokens=K, proposer=oracle_proposer(oracle_script(llm, twice, K, 2.5)),
                      max_num_seqs=2)
    outs = oracle.generate(twice.prompt_list(), twice.params(ignore_eos=True))
    assert outs[0].token_ids == outs[1].token_ids  # lossless: the same tokens
    assert outs[0].stats.accepted_per_position != outs[1].stats.accepted_per_position


def test_admission_queues_its_copies_without_a_host_wait():
    """The async runner admits a request while the device still runs the step before: each of
    admission's three copies (sequence, length, key) into the device tables is non-blocking, so
    on CUDA it is queued from pinned memory rather than waited for. The rows land as written."""
    from engine.bench.oracle import OracleProposer
    script = OracleScript(2.5, {(10, 11, 12): tuple(range(20, 40))})
    oracle = OracleProposer(script, k=K, num_slots=2, max_len=8, vocab_size=260, device="cpu")
    with TensorCopies() as copies:
        oracle.admit(1, [10, 11, 12], rng_key=7)
    assert [kwargs for *_, kwargs in copies.calls] == [{"non_blocking": True}] * 3
    assert oracle.sequence[1].tolist() == [10, 11, 12, 20, 21, 22, 23, 24] and oracle.length[1].item() == 8
