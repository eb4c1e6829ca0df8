"""The oracle's parts without an engine run (engine/bench/oracle.py): the acceptance it solves for and
the moments of T, its hashes (pinned: every earlier oracle measurement corrupted these drafts),
the drafts it proposes for a request near and past the end of its known sequence, and its
refusals, word for word. tests/bench/test_oracle.py runs it in the engine."""
from types import SimpleNamespace

import pytest
import torch

from engine.bench.oracle import (
    MASK32,
    OracleProposer,
    OracleScript,
    _mix32,
    acceptance_for_tau,
    corrupted,
    oracle_proposer,
    request_key32,
    tokens_per_step_moments,
)
from engine.errors import SpecgateError
from engine.proposers import ProposeInput
from engine.tokenizer import PAD_ID


@pytest.mark.parametrize("tau, k, a", [
    (1.0, 4, 0.0), (3.0, 2, 1.0), (5.0, 4, 1.0),            # the ends: nothing kept, everything kept
    (2.0, 4, 0.5187900636758842), (3.0, 4, 0.741270910566002), (2.5, 4, 0.6444709991232433),
    # Near τ = 1 the acceptance is tiny and every one of the 60 halvings of [0, 1] shows.
    (1 + 1e-9, 1, 9.999999712843877e-10)])
def test_the_acceptance_is_the_bisections_root_to_the_bit(tau, k, a):
    assert acceptance_for_tau(tau, k) == a


@pytest.mark.parametrize("a, k, moments", [(0.5, 1, (1.5, 0.25)), (0.5, 2, (1.75, 0.6875)),
                                           (1.0, 4, (5.0, 0.0)), (0.0, 4, (1.0, 0.0))])
def test_tokens_per_step_mean_and_variance_are_the_truncated_geometric_ones(a, k, moments):
    """k=2, a=1/2: P(T=1, 2, 3) = 1/2, 1/4, 1/4, so E[T] = 7/4 and Var[T] = 11/16."""
    assert tokens_per_step_moments(a, k) == moments


def test_the_hashes_are_pinned_and_alike_on_ints_and_int64_tensors():
    values = [0, 1, 2, 12345, MASK32, 1 << 31]
    mixed = [0, 824515495, 1722258072, 1747545881, 539527247, 1029333365]
    assert [_mix32(x) for x in values] == mixed
    assert _mix32(torch.tensor(values)).tolist() == mixed
    assert (request_key32(0, [1, 2, 3]), request_key32(1, [1, 2, 3]), request_key32(0, [1, 2, 4])) == \
        (1400951171, 685044250, 2595137626)


def test_a_draft_is_corrupted_iff_its_positions_coin_is_below_the_threshold():
    """The coin of position 3 of this request is 1007406090 (of 2**32): a threshold equal to it
    keeps the draft, one more corrupts it. At a threshold of 2**31 (a = 1/2), positions 0..7."""
    key = request_key32(7, [256, 10, 20])
    assert key == 3835260175
    assert (corrupted(key, 3, 1007406090), corrupted(key, 3, 1007406091)) == (False, True)
    pattern = [True, True, True, True, False, True, True, True]
    assert [corrupted(key, p, 1 << 31) for p in range(8)] == pattern
    assert corrupted(torch.tensor([key]), torch.arange(8), 1 << 31).tolist() == pattern


def propose(oracle: OracleProposer, slots: list[int], committed: list[int]) -> tuple[list, list]:
    drafts, num_draft, q = oracle.propose(ProposeInput(None, torch.tensor(committed), None, torch.tensor(slots), None))
    assert q is None
    return drafts.tolist(), num_draft.tolist()


def test_near_and_past_the_end_of_its_sequence_a_request_drafts_what_is_left():
    """The prompt (1, 2, 3) and a 6-token continuation, cut to a row of max_len 8 (so the row is
    full), at τ = k+1 (no draft corrupted), admitted in 4 slots and proposed at 3, 6, 8 and 9
    committed tokens: 3 drafts, then the 2 left (the last position of the row read, not clamped
    away), then none, and none (not a negative count) for a request one step past its end."""
    script = OracleScript(4.0, {(1, 2, 3): (10, 11, 12, 13, 14, 15)})
    oracle = OracleProposer(script, k=3, num_slots=4, max_len=8, vocab_size=20, device="cpu")
    for slot in range(4):
        oracle.admit(slot, [1, 2, 3], rng_key=7)
    assert propose(oracle, [0, 1, 2, 3], [3, 6, 8, 9]) == (
        [[10, 11, 12], [13, 14, PAD_ID], [PAD_ID] * 3, [PAD_ID] * 3], [3, 2, 0, 0])


CONTINUATION = (0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1)


def test_a_corrupted_draft_is_another_token_of_the_vocabulary_pinned():
    """At τ = 1 every draft is corrupted: shifted by 1 to V-1, never onto the true token."""
    oracle = OracleProposer(OracleScript(1.0, {(3, 1): CONTINUATION}), k=4, num_slots=2, max_len=32,
                            vocab_size=5, device="cpu")
    oracle.admit(0, [3, 1], rng_key=7)
    drafts, num_draft = propose(oracle, [0, 0], [2, 6])
    assert (drafts, num_draft) == ([[1, 3, 0, 1], [3, 4, 4, 4]], [4, 4])
    true = [[0, 1, 2, 3], [4, 0, 1, 2]]
    assert all(d != t for row, truth in zip(drafts, true) for d, t in zip(row, truth))


def test_with_two_tokens_to_shift_to_a_corrupted_draft_takes_either():
    oracle = OracleProposer(OracleScript(1.0, {(3,): (0,) * 40}), k=4, num_slots=1, max_len=48, vocab_size=3,
                            device="cpu")
    oracle.admit(0, [3], rng_key=1)
    drafts, _ = propose(oracle, [0] * 9, list(range(1, 37, 4)))
    assert {d for row in drafts for d in row} == {1, 2}


def test_the_corruption_pattern_is_the_requests_rng_keys_not_its_slots():
    """The same prompt at a = 0.64 (τ = 2.5, k = 4): rng keys 7 and 8 corrupt different drafts;
    the true tokens are 0 1 2 3 / 4 0 1 2 at 2 and 6 committed."""
    oracle = OracleProposer(OracleScript(2.5, {(3, 1): CONTINUATION}), k=4, num_slots=3, max_len=32,
                            vocab_size=5, device="cpu")
    for slot, rng_key in ((0, 7), (1, 8), (2, 7)):
        oracle.admit(slot, [3, 1], rng_key)
    drafts, _ = propose(oracle, [0, 0, 1, 1, 2, 2], [2, 6, 2, 6, 2, 6])
    assert drafts == [[0, 3, 2, 3], [4, 4, 1, 2], [0, 4, 2, 4], [4, 2, 4, 4], [0, 3, 2, 3], [4, 4, 1, 2]]


def test_the_oracles_rows_are_the_runners_state_slots(make_llm):
    """One row per state slot and position of the runner's (max_num_seqs, the padding rows'
    slot, and the positions a request's last verify step drafts past max_model_len)."""
    llm = make_llm(spec="oracle", num_spec_tokens=4, proposer=oracle_proposer(OracleScript(2.5, {})), max_num_seqs=3)
    assert llm.runner.proposer.sequence.shape == llm.runner.state.token_ids.shape


def test_a_script_records_its_target_folder_and_refuses_a_tau_that_is_no_number():
    outputs = [SimpleNamespace(prompt_token_ids=[1, 2], token_ids=[3, 4, 5])]
    assert OracleScript.from_outputs(outputs, 2.0, model="/models/t") == OracleScript(2.0, {(1, 2): (3, 4, 5)},
                                                                                      "/models/t")
    with pytest.raises(SpecgateError, match=r"^oracle tau must be a number, got '2\.5'$"):
        OracleScript("2.5")
    with pytest.raises(SpecgateError, match="^oracle tau must be a number, got True$"):
        OracleScript(True)


def test_each_oracle_refusal_word_for_word(make_llm):
    with pytest.raises(SpecgateError) as e:
        make_llm(spec="oracle")
    assert str(e.value) == (
        "spec='oracle' is for benchmarks only and needs proposer=<a factory>: the oracle replays the target's own "
        "greedy continuation (LLM(..., spec='oracle', proposer=engine.bench.oracle.oracle_proposer(script)), "
        "built by `specgate bench --spec oracle`)")
    with pytest.raises(SpecgateError) as e:
        make_llm(spec="ngram", proposer=oracle_proposer(OracleScript(2.0)))
    assert str(e.value) == "a proposer factory was given with spec='ngram'; it is used only with spec='oracle'"
    with pytest.raises(SpecgateError) as e:
        oracle_proposer({"tau": 2.0})
    assert str(e.value) == "the oracle needs an OracleScript, got dict"
