"""What a traced step says about the step still in flight when it was launched
(StepTrace.launched_behind, read by gates/lifecycle.py for a slot held past an abort): the async
runner launches step t+1 before reading step t, so each of its decode steps after the first names
the step before it; the sync runner reads every step before it launches the next, so none does."""
import pytest

from engine import SamplingParams

PROMPTS = ["def main(", "for i in range("]


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
def test_each_async_step_names_the_step_in_flight_at_its_launch(make_llm, async_runner):
    llm = make_llm(spec="ngram", num_spec_tokens=3, max_num_seqs=2, async_runner=async_runner, trace=True)
    llm.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)] * 2)
    behind = [(s.step, s.launched_behind) for s in llm.trace if s.launched_behind is not None]
    if async_runner:
        assert behind and all(b == step - 1 for step, b in behind), behind
    else:
        assert behind == []
