"""The step plan: the host-side description of one step, one record per batch row.

Every field is known without reading the device. A row is fed either from the host (its last
committed token, positions and sequence length are written here) or from the device state
the previous step wrote (the async runner's device-fed rows carry placeholders); the runner
policy decides which (engine/policy.py). A graph-arm step is padded to a fixed bucket of rows
and its context to a fixed bucket of lengths (a graph is captured per pair); padding rows run,
write only the padding slot and the sink block, and their results are dropped.

A row's drafts are the last `draft_slots` tokens of its query, its logits window the token
before them and the drafts: a verify row's whole query (its last committed token, then its
spec_width drafts); a prefill's last token, and after a preemption the drafts the request held
then (engine/scheduler.py `resume_drafts`), verified after its recomputed history.
"""
from dataclasses import dataclass, replace

from engine.config import EngineConfig
from engine.policy import RunnerPolicy
from engine.request import Request
from engine.scheduler import ScheduledBatch, resume_drafts
from engine.tokenizer import PAD_ID


@dataclass(frozen=True)
class RowPlan:
    request: Request | None         # None for a padding row
    slot: int                       # device state slot
    is_prefill: bool
    spec_width: int                 # drafts this row may verify (k, or 0)
    token_ids: list[int]            # the query; placeholders where the device supplies ids
    positions: list[int]
    seq_len: int
    num_logits: int
    block_table: list[int]          # padded with the sink block to the table width
    device_fed: bool = False
    refusal: str | None = None      # why the row is fed from the host (async runner)
    resumed_drafts: int = 0         # a prefill's draft slots after its history (resume_drafts)

    @property
    def query_len(self) -> int:
        return len(self.token_ids)

    @property
    def draft_slots(self) -> int:
        """Query tokens at the row's end that take the drafts the request holds, all verified."""
        return self.resumed_drafts if self.is_prefill else self.spec_width


@dataclass(frozen=True)
class StepPlan:
    step: int
    arm: str                        # "eager" or "graph"
    rows: list[RowPlan]             # real rows first, then padding rows (graph arm)
    max_context_len: int

    @property
    def real_rows(self) -> list[RowPlan]:
        return [row for row in self.rows if row.request is not None]

    @property
    def requests(self) -> list[Request]:
        return [row.request for row in self.real_rows]

    @property
    def num_rows(self) -> int:
        return len(self.rows)


class StepPlanner:
    def __init__(self, cfg: EngineConfig):
        self.k = cfg.k
        self.max_model_len = cfg.max_model_len
        self.block_size = cfg.block_size
        self.table_width = cfg.blocks_per_seq
        self.sink_block = cfg.total_kv_blocks  # an extra block that padding writes into
        self.padding_slot = cfg.max_num_seqs   # the device state's last slot
        self.buckets = graph_buckets(cfg.max_num_seqs)
        # The flex kernel reads as many blocks as each request has: its graphs need no context bucket.
        # The paged kernel also reads only those, but splits the bucket's context across its programs.
        self.context_buckets = (context_buckets(self.table_width, self.block_size)
                                if cfg.attention_backend != "flex" else [self.table_width * self.block_size])

    def plan(self, batch: ScheduledBatch, policy: RunnerPolicy, graph: bool) -> StepPlan:
        rows: list[RowPlan] = []
        for req, prefill, width in zip(batch.requests, batch.is_prefill, batch.spec_width):
            fed, refusal = policy.feed(req, prefill)
            rows.append(self._row(req, prefill, width, fed, refusal))
        max_context = max(len(r.block_ids) for r in batch.requests) * self.block_size  # batches are never empty
        plan = StepPlan(step=batch.step, arm="eager", rows=rows, max_context_len=max_context)
        if graph and self._fits_graph(plan):
            plan = self._pad_to_bucket(plan)
        return plan

    def _row(self, req: Request, prefill: bool, width: int, fed: bool, refusal: str | None) -> RowPlan:
        known = dict(request=req, slot=req.slot, is_prefill=prefill, spec_width=width, device_fed=fed,
                     refusal=refusal, block_table=self._table(req.block_ids))
        if prefill:
            drafts = resume_drafts(req, self.k, self.max_model_len)
            tokens = list(req.all_token_ids) + [PAD_ID] * drafts  # the device supplies the drafts
            return RowPlan(token_ids=tokens, positions=list(range(len(tokens))), seq_len=len(tokens),
                           num_logits=1 + drafts, resumed_drafts=drafts, **known)
        if fed:  # placeholders: the device state supplies the last token, positions and length
            return RowPlan(token_ids=[PAD_ID] * (1 + width), positions=[0] * (1 + width), seq_len=0,
                           num_logits=1 + width, **known)
        n = req.num_tokens
        return RowPlan(token_ids=[req.all_token_ids[-1]] + [PAD_ID] * width,
                       positions=list(range(n - 1, n + width)), seq_len=n + width, num_logits=1 + width,
                       **known)

    def _table(self, block_ids: list[int]) -> list[int]:
        return block_ids + [self.sink_block] * (self.table_width - len(block_ids))

    def _fits_graph(self, plan: StepPlan) -> bool:
        """Graphs serve uniform decode steps: no prefill, every row verifying k drafts."""
        rows = plan.rows
        return not any(row.is_prefill for row in rows) and all(row.spec_width == self.k for row in rows) \
            and not any(r.params.logits_processors for r in plan.requests)

    def _pad_to_bucket(self, plan: StepPlan, bucket: int | None = None) -> StepPlan:
        """Rows up to the smallest batch bucket that holds them, the context up to the smallest
        context bucket: attention's work grows with the context, so it is not padded to the
        longest one."""
        bucket = bucket or next(b for b in self.buckets if b >= plan.num_rows)
        context = next(c for c in self.context_buckets if c >= plan.max_context_len)
        padding = [self._padding_row() for _ in range(bucket - plan.num_rows)]
        return replace(plan, arm="graph", rows=plan.rows + padding, max_context_len=context)

    def _padding_row(self) -> RowPlan:
        width = self.k + 1
        return RowPlan(request=None, slot=self.padding_slot, is_prefill=False, spec_width=self.k,
                       token_ids=[PAD_ID] * width, positions=list(range(width)), seq_len=width,
                       num_logits=width, block_table=self._table([]))

    def padding_plan(self, bucket: int, context: int) -> StepPlan:
        """An all-padding step of `bucket` rows and context bucket `context`: what a graph is
        warmed up and captured on."""
        return self._pad_to_bucket(StepPlan(step=-1, arm="eager", rows=[], max_context_len=context), bucket)


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes a graph is captured for: powers of two up to max_num_seqs, and it."""
    return [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs] + [max_num_seqs]


def context_buckets(table_width: int, block_size: int) -> list[int]:
    """Context lengths a graph is captured for: powers of two blocks below the block table's
    width, then the whole table."""
    return [block_size << i for i in range(table_width.bit_length()) if 1 << i < table_width] \
        + [table_width * block_size]
