"""Which of a step's hidden rows become logits: each row's window (the last num_logits tokens of
its query), gathered before the LM head so the head runs on those rows only."""
from collections.abc import Callable

import torch


def gather_logits(hidden: torch.Tensor, query_start_loc: torch.Tensor, num_logits: torch.Tensor, total_logits: int,
                  width: int, compute_logits: Callable[[torch.Tensor], torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits only at logits_indices, derived from the real cu_num_logits: [R, width, V], row r's
    window first and zeros after it. Returns (logits, logits_indices, cu_num_logits)."""
    cu_num_logits = torch.nn.functional.pad(num_logits.cumsum(0), (1, 0))
    logits_indices, row, offset = build_logits_indices(query_start_loc, cu_num_logits, total_logits)
    window = compute_logits(hidden[logits_indices])
    logits = window.new_zeros(num_logits.numel(), width, window.shape[-1])
    logits[row, offset] = window
    return logits, logits_indices, cu_num_logits


def build_logits_indices(query_start_loc: torch.Tensor, cu_num_logits: torch.Tensor,
                         total_logits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row r's logits window is the last num_logits[r] tokens of its query: for a verify row
    (query = last committed token + k drafts) that starts at its query start; for a prefill
    row it is the last prompt token. Returns (logits_indices, row, offset in window)."""
    num_logits = cu_num_logits[1:] - cu_num_logits[:-1]
    num_reqs = num_logits.numel()
    row = torch.repeat_interleave(torch.arange(num_reqs, device=num_logits.device), num_logits,
                                  output_size=total_logits)
    offset = torch.arange(total_logits, device=num_logits.device) - cu_num_logits[row]
    window_start = query_start_loc[1:] - num_logits
    return window_start[row] + offset, row, offset
