"""Gate no-sync: the async decode loop, from scheduling to commit (each whole LLM.step: schedule,
plan, launch, start the result download, read the previous step's results, apply them), makes no
host read of device results beyond the ones the engine declares (engine/host_sync.py: the
one-step-late result read and each graph capture), and those are counted.

Two instruments, over the same loop, in the eager and the graph arm, for both drafters, with
several requests arriving while others decode:
- on every device, a torch function mode sees each host read of a tensor's value (.item(),
  .tolist(), .cpu(), .numpy(), int()/float()/bool()/index of a tensor, and .to('cpu') of a CUDA
  tensor) and flags one
  made outside a declared wait: this is what runs on the CPU, where nothing can synchronise, so
  a blocking read in the host loop still turns the gate red without a GPU;
- on CUDA, torch.cuda.set_sync_debug_mode("error") around each whole step makes every
  synchronising call raise (also a blocking copy, nonzero, a stream or device synchronise),
  except inside the declared waits, which switch it off while they run. On CUDA the graph arm
  replays real CUDA graphs; on the CPU it runs the padded graph plan eagerly.

With the compiled forward (compile=True), each compiled piece of the step runs with the hook
popped off torch's function-mode stack (`run_compiled_unhooked`): dynamo would otherwise trace the
host-read hook itself, which a fullgraph compile refuses, and a fullgraph-compiled piece cannot
read the host anyway (a .item() there is a graph break, refused when it compiles). The workload
then runs once unchecked before the checked run, on the same engine: compiling is start-up
(`specgate bench --measure-startup`), not a step of the loop, and the checked run then compiles
nothing (dynamo's graphs are counted before and after it: none may be added).
"""
import dataclasses
import traceback
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

from engine import SamplingParams
from engine.config import ARMS
from gates.workloads import DRAFTERS, PROMPTS, observe_plans

HAS_CUDA = torch.cuda.is_available()
CLAIMS = ("ngram", "block", "eager arm", "graph arm", "steps checked", "num_reqs>1", "prefill steps checked",
          "declared reads counted") + (("sync debug mode 'error'", "graph replayed") if HAS_CUDA else ())
WORKLOAD = tuple(zip(PROMPTS[:6], (0, 0, 0, 2, 4, 6)))  # (prompt, arrival step): arrivals while others decode
# Tensor methods that read a value onto the host (on CUDA each one waits for the device).
READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}


class HostReads(TorchFunctionMode):
    """Flags every host read of a tensor's value that the engine has not declared."""

    def __init__(self, declared):
        super().__init__()
        self.declared = declared
        self.undeclared: list[str] = []
        self.allowed = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        # .to('cpu') reads only a tensor that lives elsewhere; on the CPU it is the engine's upload.
        to_host = (name == "to" and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu"
                   and any(str(a) == "cpu" for a in (*args[1:], kwargs.get("device"))))
        if name in READS or to_host:
            if self.declared.active is not None:
                self.allowed += 1
            else:
                where = next((f for f in reversed(traceback.extract_stack()[:-1])
                              if "/engine/" in f.filename), None)
                self.undeclared.append(f".{name}() at {where.filename.rsplit('/engine/', 1)[-1]}:{where.lineno} "
                                       f"({where.line})" if where else f".{name}()")
        return func(*args, **kwargs)


class SyncFound(Exception):
    pass


def checked_step(llm, reads: HostReads) -> None:
    """One whole engine step under both instruments."""
    with reads:
        if not HAS_CUDA or not llm.config.device.startswith("cuda"):
            llm.step()
            return
        torch.cuda.set_sync_debug_mode("error")
        try:
            llm.step()
        except RuntimeError as e:
            raise SyncFound(f"step {llm.scheduler.step}: {e}") from e
        finally:
            torch.cuda.set_sync_debug_mode("default")


def is_compiled(fn) -> bool:
    return getattr(fn, "_torchdynamo_orig_callable", None) is not None


def unhooked(fn):
    """`fn` run with the host-read hook popped off torch's function-mode stack: a compiled piece
    then sees the stack it was compiled with (empty), so dynamo neither traces the hook nor
    recompiles. Popped, not disabled: inductor's own tracing goes through __torch_function__ (its
    FX proxies), and compiling with torch functions disabled failed on CUDA (prims
    convert_element_type handed a MetaProxy, the H200, torch 2.11)."""
    def call(*args, **kwargs):
        if not torch._C._len_torch_function_stack():
            return fn(*args, **kwargs)
        with torch.overrides._pop_mode_temporarily():
            return fn(*args, **kwargs)
    return call


def run_compiled_unhooked(llm) -> int:
    """Wrap each compiled piece of the engine's step (the fused forward's kernels, and every
    compiled function the runner holds, found by looking, not by a list: a piece compiled later is
    wrapped too) so it runs with the host-read hook popped off torch's function-mode stack;
    returns how many were wrapped."""
    runner, wrapped = llm.runner, 0
    for name, piece in list(vars(runner).items()):
        if is_compiled(piece):
            setattr(runner, name, unhooked(piece))
            wrapped += 1
    kernels = getattr(runner.forward, "kernels", None)
    if kernels is not None:
        compiled = {f.name: unhooked(getattr(kernels, f.name)) for f in dataclasses.fields(kernels)
                    if is_compiled(getattr(kernels, f.name))}
        runner.forward.kernels = dataclasses.replace(kernels, **compiled)
        wrapped += len(compiled)
    return wrapped


def add_workload(llm) -> None:
    for prompt, arrival in WORKLOAD:
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=32), arrival_step=arrival)


def compile_unchecked(llm) -> None:
    """The workload once before the checked run, so dynamo compiles here for what the checked run
    calls (its compiled pieces see the same empty function-mode stack both times: `unhooked`)."""
    add_workload(llm)
    while llm.has_unfinished():
        llm.step()


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_async_decode_loop_makes_no_undeclared_host_read(make_llm, gate_record, forward, drafter, graph):
    import torch._dynamo.utils as dynamo_utils
    device = "cuda" if HAS_CUDA else "cpu"
    llm = make_llm(device=device, spec=drafter, num_spec_tokens=4, graph=graph, async_runner=True, max_num_seqs=4)
    assert llm.is_async
    if llm.config.compile:
        assert run_compiled_unhooked(llm) > 0, "compile=True, and no compiled piece was found to run"
        compile_unchecked(llm)
    graphs_before = dynamo_utils.counters["stats"]["unique_graphs"]
    plans, declared = [], llm.runner.declared_syncs
    declared_before = Counter(declared.counts)
    observe_plans(llm, plans)
    reads = HostReads(declared)
    gate_record.case(drafter=drafter, graph=graph, device=device)
    add_workload(llm)
    steps = 0
    try:
        while llm.has_unfinished():
            checked_step(llm, reads)
            steps += 1
    except SyncFound as e:
        gate_record.evidence(sync=str(e), declared=dict(declared.counts - declared_before))
        pytest.fail(f"the async decode loop synchronised with the host outside a declared wait: {e}", pytrace=False)
    counted = declared.counts - declared_before
    compiled_in_check = dynamo_utils.counters["stats"]["unique_graphs"] - graphs_before
    gate_record.measure(drafter=drafter, graph=graph, device=device, forward=forward, steps=steps,
                        declared=dict(counted), reads_in_declared_waits=reads.allowed,
                        undeclared=len(reads.undeclared), compiled_in_check=compiled_in_check)
    if reads.undeclared:
        gate_record.evidence(undeclared=reads.undeclared[:10], count=len(reads.undeclared),
                             declared=dict(counted))
        pytest.fail(f"{len(reads.undeclared)} undeclared host reads in the async loop, first: "
                    f"{reads.undeclared[0]}", pytrace=False)
    arm = ARMS[graph]
    gate_record.occurred(drafter)
    gate_record.occurred("steps checked", steps > 0 and bool(plans))
    gate_record.occurred("num_reqs>1", any(n > 1 for _, _, n, _ in plans))
    gate_record.occurred("prefill steps checked", any(p for *_, p in plans))
    gate_record.occurred(f"{arm} arm", any(a == arm for _, a, _, _ in plans))
    gate_record.occurred("declared reads counted", counted["deferred result read"] > 0 and reads.allowed > 0)
    gate_record.occurred("sync debug mode 'error'", device == "cuda")
    gate_record.occurred("graph replayed", not graph or llm.runner.num_graph_replays > 0)
    assert plans, "no step ran under the check"
    assert compiled_in_check == 0, f"dynamo compiled {compiled_in_check} graphs inside the checked run"
