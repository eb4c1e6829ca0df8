"""The model runner's host side, checked directly: what `plan_step` asks the device to do for
each kind of row, how a graph-arm step is padded, what `_upload` hands the device, and the
buffers a runner owns, a graph replay's checks on a stand-in graph, and a capture's CUDA calls on
stand-ins. Then two short engine runs for what only a step shows: logits processors see the
request's own history and row, and verify gets the drafter's q. Over 300 lines because every
part drives one runner through the same helpers (make_runner, req, plan)."""
import dataclasses
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig, ModelConfig
from engine.policy import ASYNC, REFUSE_HOST_HISTORY, REFUSE_PREFILL, REFUSE_RESUMED, SYNC
from engine.proposers import NgramProposer
from engine.request import Request
from engine.runner import DeviceState, ModelRunner, step_sizes
from engine.sampling import SamplingParams
from engine.scheduler import ScheduledBatch, spec_width
from engine.tokenizer import PAD_ID

K, BLOCK, MAX_SEQS, MAX_LEN = 2, 4, 8, 16
MODEL = ModelConfig(vocab_size=260, hidden_size=8, intermediate_size=8, num_hidden_layers=3,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024)


def keep(ids, logits):
    return logits


def make_runner(max_num_seqs=MAX_SEQS, proposer=None, **kw):
    cfg = EngineConfig(model="unused", spec="ngram", num_spec_tokens=K, block_size=BLOCK,
                       max_num_seqs=max_num_seqs, max_model_len=MAX_LEN, max_num_batched_tokens=64, **kw)
    return ModelRunner(cfg, SimpleNamespace(config=MODEL), proposer or NgramProposer(K))


def req(rid, prompt, output=(), blocks=(0,), slot=0, resumed=False, **params):
    return Request(rid, list(prompt), SamplingParams(**params), rng_key=1000 + rid,
                   output_token_ids=list(output), block_ids=list(blocks), slot=slot, is_resumed=resumed)


def host_width(r):
    """The scheduler's rule (engine.scheduler.spec_width), at this test's k."""
    return spec_width(r, K)


def plan(runner, rows, is_async=False, graph=False, width=host_width):
    batch = ScheduledBatch(step=7, requests=[r for r, _ in rows], is_prefill=[p for _, p in rows],
                           spec_width=[width(r) for r, _ in rows])
    return runner.plan_step(batch, ASYNC if is_async else SYNC, graph)


def fields(p):
    """The plan's rows, column by column (host ids and positions flattened, as uploaded)."""
    rows = p.rows
    return dict(arm=p.arm, slots=[r.slot for r in rows], is_prefill=[r.is_prefill for r in rows],
                spec_width=[r.spec_width for r in rows], query_lens=[r.query_len for r in rows],
                num_logits=[r.num_logits for r in rows], draft_slots=[r.draft_slots for r in rows],
                host_token_ids=[t for r in rows for t in r.token_ids],
                host_positions=[q for r in rows for q in r.positions], host_seq_lens=[r.seq_len for r in rows],
                device_fed=[r.device_fed for r in rows], refusals=[r.refusal for r in rows],
                block_tables=[r.block_table for r in rows], max_context_len=p.max_context_len)



def named(inputs) -> dict:
    """A StepInputs' fields by name."""
    return {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}

def test_sync_plan_feeds_every_row_from_the_host():
    runner = make_runner()
    sink = runner.planner.sink_block
    assert sink == MAX_SEQS * runner.planner.table_width  # the block after the last real one
    prefill = req(0, [1, 2, 3], blocks=[0], slot=0)
    decode = req(1, [5, 6], output=[7], blocks=[1, 2], slot=2)
    p = plan(runner, [(prefill, True), (decode, False)])
    tw = runner.planner.table_width
    assert fields(p) == dict(
        arm="eager", slots=[0, 2], is_prefill=[True, False], spec_width=[K, K],
        query_lens=[3, 1 + K], num_logits=[1, 1 + K], draft_slots=[0, K],
        host_token_ids=[1, 2, 3, 7, PAD_ID, PAD_ID],   # last committed token, then draft placeholders
        host_positions=[0, 1, 2, 2, 3, 4], host_seq_lens=[3, 3 + K],
        device_fed=[False, False], refusals=[None, None],  # the sync runner refuses nothing
        block_tables=[[0] + [sink] * (tw - 1), [1, 2] + [sink] * (tw - 2)],
        max_context_len=2 * BLOCK)
    assert p.step == 7 and p.requests == [prefill, decode] and p.num_rows == 2


def test_async_plan_feeds_decode_rows_from_the_device_and_says_why_others_are_not():
    runner = make_runner()
    fresh = req(0, [1, 2], blocks=[0], slot=0)
    resumed = req(1, [3, 4], output=[5], blocks=[1], slot=1, resumed=True)
    fed = req(2, [6, 7, 8], output=[9], blocks=[2, 3, 4], slot=2)
    host = req(3, [10, 11], output=[12, 13], blocks=[5], slot=3, logits_processors=[keep])
    p = plan(runner, [(fresh, True), (resumed, True), (fed, False), (host, False)], is_async=True)
    f = fields(p)
    assert f["device_fed"] == [False, False, True, False]
    assert f["refusals"] == [REFUSE_PREFILL, REFUSE_RESUMED, None, REFUSE_HOST_HISTORY]
    assert f["spec_width"] == [K, K, K, 0]
    # The resumed prefill verifies the K drafts it held when preempted, after its history: its
    # logits window is its last committed token and those K draft slots.
    assert f["query_lens"] == [2, 3 + K, 1 + K, 1] and f["num_logits"] == [1, 1 + K, 1 + K, 1]
    assert f["draft_slots"] == [0, K, K, 0]
    # A device-fed row carries placeholders only: its ids, positions and length come from the
    # device state (the host's view of the request is a step behind).
    assert f["host_token_ids"] == [1, 2, 3, 4, 5] + [PAD_ID] * K + [PAD_ID] * (1 + K) + [13]
    assert f["host_positions"] == [0, 1, 0, 1, 2, 3, 4] + [0] * (1 + K) + [3]
    assert f["host_seq_lens"] == [2, 3 + K, 0, 4]
    assert f["max_context_len"] == 3 * BLOCK and f["arm"] == "eager"


@pytest.mark.parametrize("prompt_len, held", [(MAX_LEN - 1 - K, K), (MAX_LEN - 2, 1), (MAX_LEN - 3, 2)])
def test_a_resumed_prefill_carries_the_drafts_it_held_up_to_the_end_of_its_context(prompt_len, held):
    """A token past max_model_len is never emitted, so a resume near the end carries fewer draft
    slots: its query never outgrows the context (nor the token budget, which holds one)."""
    runner = make_runner()
    resumed = req(0, range(prompt_len), output=[5], blocks=[0, 1, 2, 3], slot=0, resumed=True)
    f = fields(plan(runner, [(resumed, True)]))
    n = prompt_len + 1
    assert f["query_lens"] == [n + held] and f["num_logits"] == [1 + held] and f["draft_slots"] == [held]
    assert f["host_token_ids"] == list(range(prompt_len)) + [5] + [PAD_ID] * held
    assert f["host_positions"] == list(range(n + held)) and f["host_seq_lens"] == [n + held]
    assert n + held <= MAX_LEN
    # a request that needs its history on the host drafts nothing, so it held nothing
    host = req(1, range(prompt_len), output=[5], blocks=[0], slot=1, resumed=True, logits_processors=[keep])
    f = fields(plan(runner, [(host, True)]))
    assert f["query_lens"] == [n] and f["num_logits"] == [1] and f["draft_slots"] == [0]


def test_graph_plan_pads_a_uniform_decode_step_to_its_bucket():
    runner = make_runner()
    tw, sink = runner.planner.table_width, runner.planner.sink_block
    rows = [(req(i, [1, 2, 3], output=[4 + i], blocks=[i], slot=i), False) for i in range(3)]
    p = plan(runner, rows, graph=True)
    width = K + 1
    assert p.num_rows == 4 and len(p.requests) == 3  # bucket 4 of [1, 2, 4, 8]
    assert fields(p) == dict(
        arm="graph", slots=[0, 1, 2, runner.planner.padding_slot], is_prefill=[False] * 4, spec_width=[K] * 4,
        query_lens=[width] * 4, num_logits=[width] * 4, draft_slots=[K] * 4,
        host_token_ids=[4, PAD_ID, PAD_ID, 5, PAD_ID, PAD_ID, 6, PAD_ID, PAD_ID] + [PAD_ID] * width,
        host_positions=[3, 4, 5] * 3 + list(range(width)), host_seq_lens=[4 + K] * 3 + [width],
        device_fed=[False] * 4, refusals=[None] * 4,
        block_tables=[[i] + [sink] * (tw - 1) for i in range(3)] + [[sink] * tw],
        max_context_len=BLOCK)  # one block of context: the smallest context bucket


@pytest.mark.parametrize("blocks, context", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 6)])
def test_graph_plan_pads_the_context_to_the_smallest_context_bucket(blocks, context):
    """Context buckets are powers of two blocks, then the whole table: attention's work follows
    the longest context of the batch, not max_model_len."""
    runner = make_runner()
    tw = runner.planner.table_width
    assert runner.planner.context_buckets == [BLOCK * 2 ** i for i in range((tw - 1).bit_length())] + [tw * BLOCK]
    rows = [(req(0, [1, 2], output=[3], slot=0, blocks=[0]), False),
            (req(1, [1, 2], output=[3], slot=1, blocks=list(range(1, blocks + 1))), False)]
    assert plan(runner, rows, graph=True).max_context_len == context * BLOCK
    padding = runner.planner.padding_plan(2, tw * BLOCK)
    assert (padding.num_rows, padding.max_context_len, padding.requests) == (2, tw * BLOCK, [])


@pytest.mark.parametrize("max_num_seqs, rows, bucket", [
    (8, 1, 1), (8, 2, 2), (8, 3, 4), (8, 5, 8), (8, 8, 8), (6, 5, 6), (6, 3, 4)])
def test_graph_plan_rows_are_the_smallest_bucket_that_holds_the_batch(max_num_seqs, rows, bucket):
    runner = make_runner(max_num_seqs=max_num_seqs)
    batch = [(req(i, [1, 2], output=[3], slot=i, blocks=[i]), False) for i in range(rows)]
    p = plan(runner, batch, graph=True)
    assert (p.arm, p.num_rows, len(p.requests)) == ("graph", bucket, rows)
    assert [r.slot for r in p.rows[rows:]] == [runner.planner.padding_slot] * (bucket - rows)
    assert all(r.request is None for r in p.rows[rows:])


@pytest.mark.parametrize("rows, graph, width, arm", [
    ([("decode", False), ("decode", False)], True, host_width, "graph"),
    ([("decode", False), ("decode", False)], False, host_width, "eager"),   # graph off
    ([("prefill", True), ("decode", False)], True, host_width, "eager"),    # a prefill row
    ([("prefill", True)], True, host_width, "eager"),
    ([("decode", False), ("procs", False)], True, host_width, "eager"),     # a row without drafts
    ([("decode", False), ("decode", False)], True, lambda r: 0, "eager"),   # narrower than k
    ([("procs", False)], True, lambda r: K, "eager"),                       # host callables
], ids=["uniform-decode", "graph-off", "prefill", "prefill-only", "host-history", "width-0", "processors"])
def test_only_uniform_decode_steps_take_the_graph_arm(rows, graph, width, arm):
    runner = make_runner()
    kinds = {"decode": {}, "prefill": {}, "procs": {"logits_processors": [keep]}}
    batch = [(req(i, [1, 2], output=[] if prefill else [3], slot=i, blocks=[i], **kinds[kind]), prefill)
             for i, (kind, prefill) in enumerate(rows)]
    p = plan(runner, batch, graph=graph, width=width)
    assert p.arm == arm
    assert p.num_rows == len(rows)  # buckets 1 and 2 need no padding


def test_upload_gives_padding_rows_greedy_params_and_fixed_dtypes():
    runner = make_runner()
    rows = [(req(i, [1, 2], output=[3], slot=i, blocks=[i], temperature=1, top_k=5, top_p=1), False)
            for i in range(3)]
    inp = runner._upload(plan(runner, rows, graph=True))
    # Padding rows run as SamplingParams(temperature=0) would, with key 0: valid, greedy
    # parameters that draw no randomness.
    assert inp.temperature.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert inp.top_k.tolist() == [5, 5, 5, -1]
    assert inp.top_p.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert inp.keys.tolist() == [1000, 1001, 1002, 0]
    # Integer-valued params still upload as float32; flags and integers go in the one int64 buffer.
    inp = runner._upload(plan(runner, rows))
    dtypes = {name: t.dtype for name, t in named(inp).items()}
    assert dtypes == dict(slots=torch.long, query_lens=torch.long, spec_width=torch.long, num_logits=torch.long,
                          device_fed=torch.long, draft_slots=torch.long, host_token_ids=torch.long,
                          host_positions=torch.long, host_seq_lens=torch.long, block_tables=torch.long,
                          temperature=torch.float32, top_k=torch.long, top_p=torch.float32, keys=torch.long)
    assert inp.block_tables.shape == (3, runner.planner.table_width)


def test_upload_stages_every_field_in_one_buffer_per_dtype_at_fixed_places():
    """One int64 and one float32 buffer hold a step's inputs (one host-to-device copy each);
    a step of the same rows and tokens finds each field at the same address, which is what
    lets a graph replay read its inputs in place."""
    runner = make_runner()
    rows = [(req(i, [1, 2], output=[3], slot=i, blocks=[i, i + 8], temperature=0.5, seed=i), False)
            for i in range(3)]
    p = plan(runner, rows, graph=True)
    first = runner._upload(p)
    ints, floats = runner.staging.device
    for t in named(first).values():
        buffer = floats if t.dtype == torch.float32 else ints
        assert buffer.data_ptr() <= t.data_ptr() < buffer.data_ptr() + buffer.numel() * buffer.element_size()
    f = fields(p)
    assert {name: getattr(first, name).tolist()
            for name in ("slots", "host_token_ids", "host_positions", "block_tables")} \
        == {name: f[name] for name in ("slots", "host_token_ids", "host_positions", "block_tables")}
    assert first.device_fed.tolist() == [0] * 4 and first.temperature.tolist() == [0.5] * 3 + [0.0]
    again = runner._upload(plan(runner, rows[:1] + rows[2:], graph=True))  # 2 rows: bucket 2
    assert again.slots.tolist() == [0, 2]
    same = runner._upload(p)
    assert all(getattr(same, name).data_ptr() == t.data_ptr() for name, t in named(first).items())


@pytest.mark.parametrize("has_q", [False, True], ids=["one-hot-q", "drafter-q"])
def test_runner_buffers(has_q):
    """One state row per sequence plus the padding row (the last); each row holds the block
    table's span plus one verify step; the KV cache holds the configured blocks plus the sink."""
    proposer = NgramProposer(K)
    if has_q:
        proposer.has_q = True
    runner = make_runner(proposer=proposer, num_kv_blocks=20)
    tw = runner.planner.table_width
    assert tw * BLOCK >= MAX_LEN + 2 * K + 1  # every position a request may write
    s = runner.state
    assert runner.planner.padding_slot == MAX_SEQS == s.token_ids.shape[0] - 1
    assert s.token_ids.shape == (MAX_SEQS + 1, tw * BLOCK + K + 1) and s.token_ids.dtype == torch.long
    assert (s.token_ids == PAD_ID).all()
    assert s.num_committed.tolist() == [1] * (MAX_SEQS + 1)
    assert s.draft_token_ids.shape == (MAX_SEQS + 1, K) and (s.draft_token_ids == PAD_ID).all()
    assert s.num_draft.tolist() == [0] * (MAX_SEQS + 1)
    if has_q:
        assert s.draft_probs.shape == (MAX_SEQS + 1, K, MODEL.vocab_size) and not s.draft_probs.any()
    else:
        assert s.draft_probs is None  # verify then treats q as one-hot on the draft
    assert len(runner.kv_caches) == MODEL.num_hidden_layers
    for cache in runner.kv_caches:
        assert cache.shape == (2, 21 * BLOCK, MODEL.num_key_value_heads, MODEL.dim_per_head)
        assert cache.dtype == torch.float32 and not cache.any()
    assert runner.graphs == {} and runner.results is None and not runner.is_cuda


def test_graphs_are_captured_up_front_on_cuda_only():
    """On the CPU a graph-arm step runs eagerly (padded): start-up captures nothing."""
    runner = make_runner(graph=True)
    runner.capture_graphs()
    assert runner.graphs == {} and runner.graph_pool is None and runner.num_graph_replays == 0


class CountedGraph:
    """A captured graph's stand-in (torch.cuda.CUDAGraph needs CUDA): it counts its replays."""
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_a_graph_replay_reads_its_inputs_in_place_and_counts_each_replay():
    """_replay on a graph-arm runner's own plan: refused, naming the bucket, when the bucket has no
    graph or the staged inputs are not the captured ones; otherwise each replay is counted once
    and returns the graph's own outputs (the bench and the veto's evidence read the count)."""
    runner = make_runner(graph=True)
    p = plan(runner, [(req(i, [1, 2, 3], output=[4], blocks=[i], slot=i), False) for i in range(3)], graph=True)
    key = (p.num_rows, p.max_context_len)
    graph, outputs = CountedGraph(), {"logits": torch.zeros(1)}
    for graphs, message in [({}, f"no CUDA graph for (rows, context) {key}: capture_graphs() runs at start-up"),
                            ({key: (graph, SimpleNamespace(slots=torch.zeros(1, dtype=torch.long)), outputs)},
                             f"graph {key}: the staged inputs moved since capture")]:
        runner.graphs = graphs
        with pytest.raises(RuntimeError) as refused:
            runner._replay(p, runner._upload(p))
        assert str(refused.value) == message
    runner.graphs = {key: (graph, runner._upload(p), outputs)}
    assert runner._replay(p, runner._upload(p)) is outputs and runner._replay(p, runner._upload(p)) is outputs
    assert graph.replays == runner.num_graph_replays == 2


class StandInStream:
    """A CUDA stream's stand-in: it logs which stream waits for which."""
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append((self.name, "waits for", other.name))


class CaptureCalls:
    """Stand-ins for the CUDA calls a graph capture makes (streams, a graph and its capture need
    CUDA), and for the runner's device step: each call goes into one log, in order."""
    def __init__(self, runner, monkeypatch):
        self.log = []
        self.current, self.side = StandInStream("current", self.log), StandInStream("side", self.log)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "Stream", lambda: self.side)
        monkeypatch.setattr(torch.cuda, "stream", self._context("stream"))
        monkeypatch.setattr(torch.cuda, "CUDAGraph", CountedGraph)
        monkeypatch.setattr(torch.cuda, "graph", self._context("capture"))

        def device_step(inputs, sizes, graph=False):
            out = SimpleNamespace()  # a fresh object: the graph must keep the captured call's
            self.log.append(("device step", inputs, sizes, graph, runner.declared_syncs.active, out))
            return out
        runner.device_step = device_step

    def _context(self, name):
        @contextmanager
        def logged(*args, **kwargs):
            self.log.append((name, *args, kwargs))
            yield
            self.log.append(("end " + name,))
        return logged


def test_a_capture_warms_up_on_a_side_stream_then_captures_the_padding_step_in_its_declared_wait(monkeypatch):
    """_capture, whose CUDA calls are stood in for: the bucket's padding step is staged, run once
    on a side stream that waited for the current one (the warm-up, graph arm), then captured
    on the same inputs inside the declared wait `graph capture`, into the engine's shared pool;
    the graph keeps those inputs and the captured call's outputs."""
    runner = make_runner(graph=True)
    runner.graph_pool = object()  # a CUDA engine's shared pool (None on the CPU)
    calls = CaptureCalls(runner, monkeypatch)
    key = (runner.planner.buckets[-1], runner.planner.context_buckets[0])
    runner._capture(key)
    graph, static_in, static_out = runner.graphs[key]
    staged = {name: t.tolist() for name, t in named(static_in).items()}  # before another upload reuses the buffers
    padding = runner.planner.padding_plan(*key)
    warm_out = calls.log[2][-1]
    assert calls.log == [("side", "waits for", "current"), ("stream", calls.side, {}),
                         ("device step", static_in, step_sizes(padding), True, None, warm_out), ("end stream",),
                         ("current", "waits for", "side"), ("capture", graph, {"pool": runner.graph_pool}),
                         ("device step", static_in, step_sizes(padding), True, "graph capture", static_out),
                         ("end capture",)]
    assert isinstance(graph, CountedGraph) and static_out is not warm_out and list(runner.graphs) == [key]
    assert runner.declared_syncs.counts == {"graph capture": 1}
    assert staged == {name: t.tolist() for name, t in named(runner._upload(padding)).items()}, \
        "not the bucket's padding"


def test_device_state_allocates_draft_probs_only_for_a_drafter_with_q():
    assert DeviceState(3, 10, 2, 50, False, "cpu").draft_probs is None
    q = DeviceState(3, 10, 2, 50, True, "cpu").draft_probs
    assert q.shape == (3, 2, 50) and q.dtype == torch.float32 and not q.any()


def test_logits_processors_see_their_own_history_and_row_under_spec_decoding(make_llm):
    """A request with processors verifies no drafts; its processors get its output so far and
    the logits of its next token, and what they return is what it samples from."""
    seen = []

    def record(ids, logits):
        seen.append(list(ids))
        return logits

    def force_a(ids, logits):
        return torch.where(torch.arange(logits.numel()) == ord("a"), 0.0, float("-inf"))

    llm = make_llm(spec="ngram", num_spec_tokens=2, max_model_len=64, max_num_seqs=3, async_runner=False)
    prompt = "x = 1\nx = 1\nx ="
    outs = llm.generate([prompt] * 3, [SamplingParams(temperature=0, max_tokens=5),
                                       SamplingParams(temperature=0, max_tokens=5, logits_processors=[record]),
                                       SamplingParams(temperature=0, max_tokens=5, logits_processors=[force_a])])
    plain, recorded, forced = (o.token_ids for o in outs)
    assert recorded == plain
    assert seen == [recorded[:i] for i in range(5)]
    assert forced == [ord("a")] * 5


@pytest.mark.parametrize("spec", ["ngram", "block"])
def test_verify_gets_the_drafters_q(make_llm, monkeypatch, spec):
    """The block drafter samples its drafts from q, so verify must get q itself; the ngram
    drafter's q is one-hot, which verify takes as None (a zero q would accept any draft)."""
    import engine.runner
    calls = []

    def spy(logits, drafts, num_draft, draft_probs, *rest):
        calls.append((num_draft.clone(), None if draft_probs is None else draft_probs.clone(), drafts.clone()))
        return verify(logits, drafts, num_draft, draft_probs, *rest)

    verify = engine.runner.verify
    monkeypatch.setattr(engine.runner, "verify", spy)
    llm = make_llm(spec=spec, num_spec_tokens=2, max_model_len=64, max_num_seqs=2, async_runner=False)
    llm.generate(["x = 1\nx = 1\nx =", "def f(a):\n    return a"],
                 SamplingParams(temperature=0.8, seed=3, max_tokens=6))
    assert any(int(n.sum()) for n, _, _ in calls), "some step must verify drafts"
    for num_draft, q, drafts in calls:
        if spec == "ngram":
            assert q is None
            continue
        assert q is not None and q.shape == (*drafts.shape, llm.model_config.vocab_size)
        for r, n in enumerate(num_draft.tolist()):
            for j in range(n):
                assert torch.isclose(q[r, j].sum(), torch.tensor(1.0)) and q[r, j, drafts[r, j]] > 0
