"""A step's result row: what the host reads back from the device for one request, and (CUDA)
the pinned ring the results land in.

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


class ResultRing:
    """CUDA: where steps' packed results land on the host. Pinned buffers and their copy events,
    allocated once: a pinned allocation, an event and a second stream's handshake per step were
    host work in the launch phase, which the async runner must finish inside the device's step.

    The copy is queued on the step's own stream, right behind it: ordered after the step wrote
    the results and before the next step (a graph replay) overwrites them, with no cross-stream
    wait; it moves (k + 3) x 8 bytes a row. A buffer is reused only once its step was read: the
    async runner has at most two steps unread (the one in flight and the one being launched),
    so a third buffer never waits, and a fourth unread step is an engine bug, refused."""

    DEPTH = 3

    def __init__(self, max_rows: int, width: int):
        self.buffers = [torch.empty((max_rows, width), dtype=torch.long, pin_memory=True)
                        for _ in range(self.DEPTH)]
        self.events = [torch.cuda.Event() for _ in range(self.DEPTH)]
        self.unread = [False] * self.DEPTH
        self.turn = 0

    def download(self, packed: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event", int]:
        """Queue the copy of `packed` ([rows, width] on the device) into the next buffer: (its
        host view, the event recorded when the copy is done, the buffer's slot)."""
        slot = self.turn
        if self.unread[slot]:
            raise RuntimeError(f"result ring: buffer {slot} still holds an unread step's results "
                               f"({self.DEPTH} steps launched and not read)")
        self.turn = (slot + 1) % self.DEPTH
        host = self.buffers[slot][:packed.shape[0]]
        host.copy_(packed, non_blocking=True)
        self.events[slot].record()
        self.unread[slot] = True
        return host, self.events[slot], slot

    def release(self, slot: int) -> None:
        """The host has read the buffer's results (ModelRunner.read): it may be refilled."""
        self.unread[slot] = False
