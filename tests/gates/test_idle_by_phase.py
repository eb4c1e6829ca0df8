"""The busy gate's idle profile (gates/idle.py): device idle time charged to the host phase open
during it, on synthetic timelines and on a real engine's profiler ranges (CPU)."""
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from engine import SamplingParams
from gates.idle import OUTSIDE, PHASES, host_phase_ranges, host_ranges, idle_by_phase, idle_gaps, time_in_phase


def test_gaps_are_the_window_minus_the_busy_intervals():
    assert idle_gaps([(10, 20), (15, 30), (40, 50)], (0, 60)) == [(0, 10), (30, 40), (50, 60)]
    assert idle_gaps([(0, 60)], (0, 60)) == []
    assert idle_gaps([], (5, 9)) == [(5, 9)]


def test_idle_time_goes_to_the_innermost_open_phase_and_the_rest_outside():
    gaps = [(0, 100)]
    ranges = [("launch", 10, 60), ("upload", 20, 40), ("read", 70, 200)]
    charged = idle_by_phase(gaps, ranges)
    assert charged["upload"] == 20          # nested in launch: the inner one
    assert charged["launch"] == 10 + 20     # 10-20 and 40-60
    assert charged["read"] == 30            # 70-100, clipped to the gap
    assert charged[OUTSIDE] == 10 + 10      # 0-10 and 60-70
    assert sum(charged.values()) == 100     # every idle nanosecond charged once


def test_time_in_each_phase_is_clipped_to_the_window_and_nested_phases_count_in_their_parent():
    spent = time_in_phase([("launch", 10, 60), ("upload", 20, 40), ("read", 70, 200)], (0, 100))
    assert (spent["launch"], spent["upload"], spent["read"], spent["plan"]) == (50, 20, 30, 0)


def test_a_real_engine_marks_every_phase_and_is_left_as_it_was(make_llm):
    llm = make_llm(spec="ngram", num_spec_tokens=3, max_num_seqs=4, async_runner=True)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    bound = {name: getattr(llm.runner, name) for name in ("launch", "read", "_upload", "plan_step")}
    with profile(activities=[ProfilerActivity.CPU]) as prof, host_phase_ranges(llm):
        outs = llm.generate(["the cat sat on", "a b a b a b", "once upon a time there"], params)
    assert all(len(o.token_ids) == 6 for o in outs)
    ranges = host_ranges(e for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CPU)
    assert {name for name, _, _ in ranges} == set(PHASES)
    launches = [(start, end) for name, start, end in ranges if name == "launch"]
    uploads = [(start, end) for name, start, end in ranges if name == "upload"]
    assert len(launches) == len(uploads) > 6  # one upload per step, nested in its launch
    assert all(any(a <= s and e <= b for a, b in launches) for s, e in uploads)
    # The instance wrappers are gone: the engine's methods are its class's again.
    assert all(getattr(llm.runner, name) == method for name, method in bound.items())
    assert "schedule" not in vars(llm.scheduler) and "_apply" not in vars(llm)
