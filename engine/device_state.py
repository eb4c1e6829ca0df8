"""The device state a request carries from one step to the next, per state slot: its committed
ids and count, and the drafts the last propose wrote for it (engine/runner.py reads and writes
them inside the step). A preempted request gives its slot up but keeps its drafts: they are
copied out, kept on the device by request id, and given to the slot it resumes in, whose
prefill verifies them (engine/scheduler.py `resume_drafts`), so preemption moves no draw.
"""
from dataclasses import dataclass

import torch

from engine.tokenizer import PAD_ID


@dataclass(frozen=True)
class HeldDrafts:
    """The drafts a preempted request held, kept on the device until its resume verifies them."""
    token_ids: torch.Tensor          # [k]
    num_draft: torch.Tensor          # [1]
    probs: torch.Tensor | None       # [k, V]: q, for a drafter that samples its drafts


class DeviceState:
    """Per-slot device buffers that carry a request from one step to the next. The last slot
    belongs to padding rows."""

    def __init__(self, num_slots: int, max_len: int, k: int, vocab_size: int, with_q: bool, device: str):
        self.token_ids = torch.full((num_slots, max_len), PAD_ID, dtype=torch.long, device=device)
        self.num_committed = torch.ones(num_slots, dtype=torch.long, device=device)
        self.draft_token_ids = torch.full((num_slots, k), PAD_ID, dtype=torch.long, device=device)
        self.num_draft = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.draft_probs = (torch.zeros(num_slots, k, vocab_size, device=device) if with_q else None)
        self.preempted_drafts: dict[int, HeldDrafts] = {}  # request id -> the drafts it held

    def drafts_of(self, slot: int) -> HeldDrafts:
        """A copy of the drafts a slot holds (queued on the device after the steps before it)."""
        q = self.draft_probs[slot].clone() if self.draft_probs is not None else None
        return HeldDrafts(self.draft_token_ids[slot].clone(), self.num_draft[slot:slot + 1].clone(), q)

    def give_drafts(self, slot: int, held: HeldDrafts) -> None:
        self.draft_token_ids[slot] = held.token_ids
        self.num_draft[slot:slot + 1] = held.num_draft
        if held.probs is not None:
            self.draft_probs[slot] = held.probs

    def keep_drafts(self, request_id: int, slot: int) -> None:
        """The request left `slot` (preempted): copy its drafts out before another request takes
        the slot. Queued after every step launched so far, so the copy is the drafts of its last
        step, even one still in flight."""
        self.preempted_drafts[request_id] = self.drafts_of(slot)

    def resume_drafts(self, request_id: int, slot: int) -> None:
        """The request resumes in `slot`: its prefill verifies the drafts it held. Every preempted
        request keeps some, so a missing entry is an engine bug (KeyError)."""
        self.give_drafts(slot, self.preempted_drafts.pop(request_id))

    def forget_drafts(self, request_id: int) -> None:
        """The request ended (finished by a step read late, or aborted), maybe while preempted."""
        self.preempted_drafts.pop(request_id, None)
