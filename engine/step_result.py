"""A step's result row: what the host reads back from the device for one request.

The device packs a step's results into one tensor (one copy to the host); this is the one
place that knows the layout: per row, the k + 1 sampled tokens, then num_accepted, then
num_draft.
"""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepResult:
    sampled: list[int]      # accepted drafts, then the correction/bonus token; -1 after
    num_accepted: int
    num_draft: int          # real drafts verified this step

    @property
    def emitted(self) -> list[int]:
        """The tokens this step adds to the request: the accepted drafts and one more."""
        return self.sampled[:self.num_accepted + 1]

    @staticmethod
    def pack(sampled: torch.Tensor, num_accepted: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
        """[R, k+1], [R], [R] device tensors -> one [R, k+3] tensor."""
        return torch.cat([sampled, num_accepted[:, None], num_draft[:, None]], dim=1)

    @classmethod
    def unpack(cls, packed: list[list[int]]) -> list["StepResult"]:
        """The host copy of `pack`'s tensor (as lists) -> one StepResult per row."""
        return [cls(sampled=row[:-2], num_accepted=row[-2], num_draft=row[-1]) for row in packed]
