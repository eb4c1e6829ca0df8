"""The gates' workload strategy (gates/workloads.py): a mixed draw always mixes, so a gate that
asserts rows were combined on the device, or that refused and device-fed requests shared a step,
never meets a draw that cannot show it."""
from hypothesis import given, settings

from gates.workloads import workloads


@settings(max_examples=200, deadline=None)
@given(workload=workloads(host_history=None))
def test_a_mixed_workload_has_a_device_fed_request_and_with_two_a_host_history_one(workload):
    assert not all(workload.host_history)
    if workload.num_reqs > 1:
        assert any(workload.host_history)


@given(fed=workloads(host_history=False), held=workloads(host_history=True))
def test_the_pure_workloads_stay_pure(fed, held):
    assert not any(fed.host_history) and all(held.host_history)
