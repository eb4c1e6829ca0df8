"""One workload type (issue 12, point 6): the engine's Workload serves the bench and the gates."""
import pytest

from engine import SamplingParams
from engine.bench import legs as bench
from engine.bench.workload import Workload
from gates import workloads as gate_workloads

# Written by the bench's own Workload before the merge (engine/bench/legs.py at c2a355a), for the same
# prompts, max_tokens and temperature: reports stay comparable across the change.
BENCH_BEFORE = [
    ((["a", "b"], 6, 0.0), "489c75a81014dcca"),
    ((["def main(", "x = 1\n" * 3, "ü"], 64, 0.8), "fa89b4a4e11a06e7"),
]


@pytest.mark.parametrize("args, fingerprint", BENCH_BEFORE)
def test_the_bench_fingerprint_and_json_are_unchanged(args, fingerprint):
    prompts, max_tokens, temperature = args
    workload = Workload.uniform(prompts, max_tokens, temperature)
    assert workload.fingerprint() == fingerprint
    assert bench.report([], workload, {"spec": None})["workload"] == {
        "fingerprint": fingerprint, "num_prompts": len(prompts), "max_tokens": max_tokens, "temperature": temperature}


def test_the_gates_and_the_bench_use_the_one_definition():
    assert bench.Workload is gate_workloads.Workload is Workload
    assert gate_workloads.MIXED_REFUSALS.fingerprint() != Workload.uniform(
        gate_workloads.MIXED_REFUSALS.prompts, 40).fingerprint()  # arrivals and host history count


def test_params_per_request_with_the_host_history_processor_passed_in():
    w = Workload(("a", (1, 2, 3)), max_tokens=(3, 5), arrival_steps=(0, 2), host_history=(False, True),
                 temperature=0.5, seeds=(7, None))
    with pytest.raises(ValueError, match="^workload: host-history requests need a host_processor$"):
        w.params()
    first, second = w.params(gate_workloads.no_immediate_repeat, seed=1, ignore_eos=True)
    assert first == SamplingParams(temperature=0.5, max_tokens=3, seed=7, ignore_eos=True)
    assert (second.max_tokens, second.seed, second.logits_processors) == (5, 1, [gate_workloads.no_immediate_repeat])
    assert w.prompt_list() == ["a", [1, 2, 3]] and w.arrivals() == [0, 2]
    with pytest.raises(ValueError, match="2 arrival_steps for 3 prompts"):
        Workload(("a", "b", "c"), (1, 1, 1), arrival_steps=(0, 1))


def test_token_id_prompts_are_fed_as_they_are(make_llm):
    llm = make_llm()
    w = Workload.uniform([[256, 100, 101], "de"], 3)
    outs = llm.generate(w.prompt_list(), w.params(), arrival_steps=w.arrivals())
    assert outs[0].prompt_token_ids == [256, 100, 101] and outs[1].prompt_token_ids == llm.tokenizer.encode("de")


EVERY_PART = dict(prompts=("a", (1, 2, 3)), max_tokens=(3, 5), arrival_steps=(0, 2), host_history=(False, True),
                  temperature=0.5, seeds=(7, None), stop_token_ids=((), (9, 10)), ignore_eos=(True, False))
# Another value of each part, for the same two requests.
OTHER_VALUE = dict(prompts=("a", (1, 2, 4)), max_tokens=(3, 6), arrival_steps=(1, 2), host_history=(True, True),
                   temperature=0.7, seeds=(7, 8), stop_token_ids=((9,), (9, 10)), ignore_eos=(True, True))


def test_a_fingerprint_names_every_part_of_a_workload():
    """Reports name their workload by fingerprint: a change to any one part changes it, the same
    content gives the same one (token-id prompts as lists or tuples), and a workload with every
    part set keeps the fingerprint it was first written with, so reports stay comparable."""
    full = Workload(**EVERY_PART)
    assert full.fingerprint() == "12a6fe5dfa0a4801" and full.max_tokens_json() == [3, 5]
    assert Workload(**{**EVERY_PART, "prompts": ("a", [1, 2, 3])}).fingerprint() == full.fingerprint()
    for part, value in OTHER_VALUE.items():
        assert Workload(**{**EVERY_PART, part: value}).fingerprint() != full.fingerprint(), part
    distinct = {Workload(**{**EVERY_PART, part: value}).fingerprint() for part, value in OTHER_VALUE.items()}
    assert len(distinct) == len(OTHER_VALUE)


def test_a_workload_built_from_lists_is_the_frozen_one_built_from_tuples():
    """Reports and caches key on workloads: lists given for token-id prompts and stop ids are
    stored as tuples, so the two spellings are equal and hash alike; a workload needs a budget."""
    listed = Workload(["a", [1, 2, 3]], [3, 5], stop_token_ids=[[9], []])
    tupled = Workload(("a", (1, 2, 3)), (3, 5), stop_token_ids=((9,), ()))
    assert listed == tupled and hash(listed) == hash(tupled)
    assert listed.prompts == ("a", (1, 2, 3)) and listed.stop_token_ids == ((9,), ())
    with pytest.raises(ValueError) as refused:
        Workload(("a",), ())
    assert str(refused.value) == "workload: max_tokens is required per request"


def test_a_uniform_workload_is_greedy_unless_asked_and_arrives_at_once():
    w = Workload.uniform(["a", "bc"], 4)
    assert (w.temperature, w.max_tokens, w.arrivals()) == (0.0, (4, 4), [0, 0])
    assert Workload.uniform(["a"], 4, temperature=0.8).temperature == 0.8


def test_seeds_are_in_the_fingerprint_whenever_any_is_set():
    seeded = dict(prompts=("a", "b"), max_tokens=(3, 3))
    assert Workload(**seeded, seeds=(1, 2)).fingerprint() != Workload(**seeded, seeds=(1, 3)).fingerprint()
    assert Workload(**seeded, seeds=(None, None)).fingerprint() == Workload(**seeded).fingerprint()


def test_each_request_s_params_carry_its_own_stop_ids():
    w = Workload(("a", "b"), max_tokens=(3, 4), stop_token_ids=((5, 6), ()))
    assert [p.stop_token_ids for p in w.params()] == [[5, 6], []]
