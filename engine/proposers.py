"""Draft proposers. Each writes k drafts per request into device buffers; nothing goes to the host.

Interface (`Proposer`): `observe(...)` sees the target's forward of a step (the block drafter
keeps the target's hidden states as its context); `propose(...)` returns drafts [R, k], num_draft
[R] (real drafts first, padding after) and q [R, k, V] or None when q is one-hot. Two host hooks,
no-ops unless a proposer needs them (as vLLM's proposers have hooks): `check_request` when a
request is added, `admit` when it is (re)admitted into a state slot. The bench's oracle
(engine/bench/oracle.py) enters through them, handed to the LLM as a `ProposerFactory`.
"""
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.sampling import SamplingTensors
from engine.tokenizer import PAD_ID


@dataclass
class ProposeInput:
    token_ids: torch.Tensor       # [R, L] committed tokens of each row's request (and stale after)
    num_committed: torch.Tensor   # [R]
    sampling: SamplingTensors     # [R] each: drafts are drawn as verify will judge them
    slots: torch.Tensor           # [R] state slots (the block drafter's context lives by slot)
    block_tables: torch.Tensor    # [R, blocks]


class Proposer:
    """What the runner and the LLM call on a drafter; the hooks default to doing nothing."""

    aux_layers: tuple[int, ...] = ()  # target layers whose outputs `observe` receives
    has_q: bool = False               # drafts sampled from q: verify needs q itself, not a one-hot
    pure_propose: bool = False        # a function of its input alone: compile=True compiles it

    def check_request(self, prompt: list[int], max_tokens: int, temperature: float) -> None:
        """Refuse (RequestError) a request this proposer cannot draft for; called when it is added."""

    def admit(self, slot: int, prompt: list[int], rng_key: int) -> None:
        """A request (re)enters state slot `slot` and is prefilled by the step being planned."""

    def observe(self, *args, **kwargs) -> None:
        """The target's forward of this step (aux layer outputs, metadata, positions, slots)."""

    def propose(self, inp: ProposeInput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError


# Builds the proposer of an LLM handed one (LLM(..., spec="oracle", proposer=factory)):
# (engine config, model folder, vocabulary size) -> Proposer.
ProposerFactory = Callable[..., Proposer]


class NgramProposer(Proposer):
    """Prompt lookup: find the earliest occurrence of the request's last n tokens (n from max_n
    down to min_n) and propose the k tokens that followed it. The earliest match has the most
    committed continuation; the most recent one, in a repeating run, has a single token."""

    pure_propose = True  # ~85 small ops a step, compiled with the forward

    def __init__(self, k: int, min_n: int = 1, max_n: int = 3):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.k, self.min_n, self.max_n = k, min_n, max_n

    def propose(self, inp: ProposeInput) -> tuple[torch.Tensor, torch.Tensor, None]:
        tokens, committed = inp.token_ids, inp.num_committed
        num_reqs, length = tokens.shape
        rows = torch.arange(num_reqs, device=tokens.device)
        best_start = torch.full((num_reqs,), -1, dtype=torch.long, device=tokens.device)
        for n in range(self.max_n, self.min_n - 1, -1):  # loop over n-gram sizes, not requests
            if length < n + 1:
                continue
            suffix_pos = (committed[:, None] - n + torch.arange(n, device=tokens.device)).clamp_min(0)
            suffix = tokens[rows[:, None], suffix_pos]
            windows = tokens.unfold(1, n, 1)                               # [R, L-n+1, n]
            start = torch.arange(windows.shape[1], device=tokens.device)
            hit = (windows == suffix[:, None, :]).all(-1) & (start + n < committed[:, None])
            earliest = torch.where(hit, start, length).amin(dim=1)
            continuation = torch.where(earliest < length, earliest + n, -1)
            best_start = torch.where(best_start >= 0, best_start, continuation)
        offsets = torch.arange(self.k, device=tokens.device)
        num_draft = torch.where(best_start >= 0, (committed - best_start).clamp(0, self.k), 0)
        idx = (best_start.clamp_min(0)[:, None] + offsets).clamp(max=length - 1)
        drafts = torch.where(offsets < num_draft[:, None], tokens[rows[:, None], idx], PAD_ID)
        return drafts, num_draft, None
