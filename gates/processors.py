"""Logits processors the gates run, beside gates.workloads.no_immediate_repeat (which reads only the
last output token, so a history with a token too many or too few shows in its tokens only by luck).

The engine's contract (docs/engine.md, "Logits processors"): a request with logits processors
verifies no drafts, so each of its steps gathers one logits row, and each processor is called once
on that row with the request's committed output before it (the prompt excluded, as a fresh list).
The j-th call therefore receives exactly the first j output tokens.

- `HistoryRecorder` changes nothing and keeps a copy of every history it receives, so a gate can
  check the contract call by call (gates/invariants.py history_difference);
- `RepetitionPenalty`, `NoRepeatNgram` and `LengthBias` change the logits by the whole history
  (the set of tokens in it, the order of its n-grams, its exact length), so a history with the
  prompt in it, a token missing or one too many changes the tokens the request emits, and
  spec, plain and the naive reference decoder (gates/reference.py, which applies the same
  processors to its own output) part ways.

Each is a frozen dataclass, so equal processors hash equal and the reference decoder's stream
cache (keyed by the prompt and the processors) is shared by every run that uses them.
"""
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, eq=False)
class HistoryRecorder:
    """A logits processor that returns the row unchanged and records, per call, a copy of the output
    history it received. One per request and run: its calls are that request's calls in order."""
    calls: list[list[int]] = field(default_factory=list)

    def __call__(self, output_ids: list[int], logits_row: torch.Tensor) -> torch.Tensor:
        self.calls.append(list(output_ids))
        return logits_row


@dataclass(frozen=True)
class RepetitionPenalty:
    """CTRL's repetition penalty (transformers' RepetitionPenaltyLogitsProcessor) over the output so
    far: each token the history holds has its logit divided by `penalty` when positive and
    multiplied by it when negative."""
    penalty: float = 1.5

    def __call__(self, output_ids: list[int], logits_row: torch.Tensor) -> torch.Tensor:
        if output_ids:
            seen = torch.tensor(sorted(set(output_ids)), device=logits_row.device)
            logits = logits_row[seen]
            logits_row[seen] = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return logits_row


@dataclass(frozen=True)
class NoRepeatNgram:
    """transformers' no_repeat_ngram_size over the output so far: a token that would complete an
    n-gram the history already holds is banned (-inf), so the ban depends on the history's order."""
    n: int = 3

    def __call__(self, output_ids: list[int], logits_row: torch.Tensor) -> torch.Tensor:
        banned = ngram_completions(output_ids, self.n)
        if banned:
            logits_row[sorted(banned)] = float("-inf")
        return logits_row


def ngram_completions(history: list[int], n: int) -> set[int]:
    """The tokens that follow an earlier occurrence of the history's last n - 1 tokens: each would
    complete an n-gram the history holds."""
    if len(history) < n:
        return set()
    suffix = history[len(history) - n + 1:]
    return {history[i + n - 1] for i in range(len(history) - n + 1) if history[i:i + n - 1] == suffix}


@dataclass(frozen=True)
class LengthBias:
    """A bias keyed by the history's exact length: `bias` is added to the token whose id is
    len(history) * stride modulo the vocabulary, so a history one token longer or shorter favours
    another token."""
    bias: float = 3.0
    stride: int = 37

    def __call__(self, output_ids: list[int], logits_row: torch.Tensor) -> torch.Tensor:
        logits_row[len(output_ids) * self.stride % logits_row.numel()] += self.bias
        return logits_row


# The chains the whole-history workloads give their requests, one per request that has any.
WHOLE_HISTORY = ((RepetitionPenalty(),), (NoRepeatNgram(),), (LengthBias(), RepetitionPenalty(1.2)))
