"""What one device step takes and gives, as typed records: `StepInputs` (the plan's columns,
staged to the device by engine/staging.py) and `StepOutputs` (what `ModelRunner.device_step`
returns: the results, and what the step fed and gathered, which the trace reads).

Shapes: R rows (real requests, then padding rows in the graph arm), T query tokens (the sum of
query_lens), L logits rows (the sum of num_logits), W block-table width, k drafts per verify.
Every integer field is int64 on the device (flags are 0/1: one staging buffer holds every
integer field, engine/staging.py); temperature and top_p are float32.
"""
from dataclasses import dataclass, field, fields
from typing import Generic, TypeVar

import torch

Column = TypeVar("Column")  # a host list while the plan's columns are gathered; a device tensor after upload

ROW = {"per": "row"}      # one value per row
TOKEN = {"per": "token"}  # one value per query token
TABLE = {"per": "table"}  # one block-table row per row
FLOAT = {"per": "row", "float": True}


@dataclass
class StepInputs(Generic[Column]):
    slots: Column = field(metadata=ROW)           # [R] state slot of each row; padding rows: the last slot
    query_lens: Column = field(metadata=ROW)      # [R] query tokens: the prompt (prefill) or 1 + spec_width
    spec_width: Column = field(metadata=ROW)      # [R] drafts the row may verify (k, or 0)
    num_logits: Column = field(metadata=ROW)      # [R] logits rows gathered: 1 + draft_slots
    device_fed: Column = field(metadata=ROW)      # [R] 0/1: ids, positions, length from the device state
    draft_slots: Column = field(metadata=ROW)     # [R] query tokens at the end that take drafts (RowPlan)
    host_seq_lens: Column = field(metadata=ROW)   # [R] sequence length after the step, as the host knows it
    top_k: Column = field(metadata=ROW)           # [R] -1: every token
    keys: Column = field(metadata=ROW)            # [R] the request's counter-based rng key
    host_token_ids: Column = field(metadata=TOKEN)   # [T] ids the host knows (device-fed rows: stale)
    host_positions: Column = field(metadata=TOKEN)   # [T]
    block_tables: Column = field(metadata=TABLE)     # [R, W] KV blocks of each row's request
    temperature: Column = field(metadata=FLOAT)      # [R] float32; 0: greedy
    top_p: Column = field(metadata=FLOAT)            # [R] float32; 1: every token


def input_fields(kind: dict) -> tuple[str, ...]:
    """The StepInputs fields of one kind (ROW, TOKEN, TABLE or FLOAT), in declaration order."""
    return tuple(f.name for f in fields(StepInputs) if f.metadata == kind)


@dataclass
class StepOutputs:
    sampled: torch.Tensor          # [R, k+1] accepted drafts, then the correction/bonus token; -1 after
    num_accepted: torch.Tensor     # [R]
    num_draft: torch.Tensor        # [R] real drafts verified this step
    input_ids: torch.Tensor        # [T] the ids the forward ran on (after combining host and device)
    positions: torch.Tensor        # [T]
    seq_lens: torch.Tensor         # [R] sequence length after the step
    query_start_loc: torch.Tensor  # [R+1] where each row's query starts in the T tokens
    cu_num_logits: torch.Tensor    # [R+1] where each row's logits start in the L rows
    logits_indices: torch.Tensor   # [L] the token rows whose logits were gathered
    draft_token_ids: torch.Tensor  # [R, k] the drafts verify read from the draft buffer
    packed: torch.Tensor           # [R, k+3] sampled, num_accepted, num_draft in one tensor (StepResult.pack),
                                   # packed on the device inside the step (in the graph arm, inside the graph)

    def packed_results(self, num_real: int) -> torch.Tensor:
        """The real rows' results, for one copy to the host (engine/step_result.py): the first
        num_real rows of `packed`, a contiguous view, so reading them back launches no kernel."""
        return self.packed[:num_real]

    def clone(self) -> "StepOutputs":
        """A copy the trace reads a step late (async runner), after a graph replay overwrote these."""
        return StepOutputs(*(getattr(self, f.name).clone() for f in fields(self)))
