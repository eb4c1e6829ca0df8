"""A step's host inputs on their way to the device: one staging buffer per dtype, one copy each.

Every integer and boolean field goes into one int64 buffer, temperature and top_p into one
float32 buffer; the device inputs are views into the matching device buffers. The layout
depends only on the step's row and token counts, so a graph-arm step of a given bucket finds
its inputs at the addresses its graph was captured with, and a replay needs no input copy.

On CUDA the host buffers are pinned and the copies asynchronous: a host buffer may be refilled
only once its last copy has run, so there is a small ring of them, each with the event of its
last copy. On the CPU the host buffer is the device buffer.

Everything a shape needs besides the values (the slices, the device views, the copies' sources
and targets) is made once a shape and kept (`Layout`): each is a tensor op the host pays per step
otherwise, and on the H200 under the busy gate's profiler the 1B shape's upload phase took 0.37 ms
a step, with about twenty such ops in it.
"""
from dataclasses import dataclass

import torch

from engine.host_sync import DeclaredSyncs
from engine.step_io import FLOAT, ROW, TOKEN, StepInputs, input_fields

ROW_FIELDS = input_fields(ROW)
TOKEN_FIELDS = input_fields(TOKEN)
FLOAT_FIELDS = input_fields(FLOAT)
RING = 2  # the async runner reads a step's results before it plans the step after next
LAYOUTS = 256  # layouts kept (engine/staging.py InputStaging.layout)


@dataclass(frozen=True)
class Layout:
    """One step shape's place in the staging buffers: the fields' slices, the device views a step
    of that shape gets (the same tensors every time: a graph bucket's inputs stay where its graph
    was captured), and per host buffer of the ring the (source, target) pair of each copy."""
    int_slices: dict[str, slice]
    float_slices: dict[str, slice]
    views: StepInputs
    copies: list[tuple[tuple[torch.Tensor, torch.Tensor], ...]]


class InputStaging:
    def __init__(self, max_rows: int, max_tokens: int, table_width: int, device: str,
                 declared_syncs: DeclaredSyncs):
        self.table_width = table_width
        self.max_rows, self.max_tokens = max_rows, max_tokens
        self.is_cuda = device.startswith("cuda")
        self.declared_syncs = declared_syncs
        int_size = max_rows * (len(ROW_FIELDS) + table_width) + max_tokens * len(TOKEN_FIELDS)
        float_size = max_rows * len(FLOAT_FIELDS)
        depth = RING if self.is_cuda else 1
        self.host = [(torch.zeros(int_size, dtype=torch.long, device="cpu", pin_memory=self.is_cuda),
                      torch.zeros(float_size, dtype=torch.float32, device="cpu", pin_memory=self.is_cuda))
                     for _ in range(depth)]
        # numpy views, taken once: filling them is the fast path, and reads no tensor in the loop
        self.host_arrays = [(ints.numpy(), floats.numpy()) for ints, floats in self.host]
        self.copied = [None] * depth  # the event of each host pair's last copy (CUDA)
        self.device = ((torch.zeros(int_size, dtype=torch.long, device=device),
                        torch.zeros(float_size, dtype=torch.float32, device=device))
                       if self.is_cuda else self.host[0])
        self.turn = 0
        # (rows, tokens) -> layout, computed once a shape: every step of a graph bucket has the same
        # one. Eager-arm shapes vary with the batch, so the cache is cleared when it holds LAYOUTS.
        self.layouts: dict[tuple[int, int], Layout] = {}

    def upload(self, columns: StepInputs[list], num_rows: int, num_tokens: int) -> StepInputs[torch.Tensor]:
        """columns: every field as a flat list, block_tables as num_rows lists of table_width.
        Returns the device views."""
        if num_rows > self.max_rows or num_tokens > self.max_tokens:
            raise RuntimeError(f"a step of {num_rows} rows and {num_tokens} tokens exceeds the staging "
                               f"buffers ({self.max_rows} rows, {self.max_tokens} tokens)")
        slot = self.turn
        self.turn = (self.turn + 1) % len(self.host)
        if self.copied[slot] is not None and not self.copied[slot].query():
            with self.declared_syncs.allow("staging buffer reuse"):
                self.copied[slot].synchronize()
        shape = self.layout(num_rows, num_tokens)
        for array, slices in zip(self.host_arrays[slot], (shape.int_slices, shape.float_slices)):
            for name, part in slices.items():
                column = getattr(columns, name)
                array[part] = column if name != "block_tables" else [t for row in column for t in row]
        if self.is_cuda:
            for source, target in shape.copies[slot]:
                target.copy_(source, non_blocking=True)
            self.copied[slot] = torch.cuda.Event()
            self.copied[slot].record()
        return shape.views

    def layout(self, num_rows: int, num_tokens: int) -> Layout:
        """Where each field of a step of num_rows rows and num_tokens tokens lies in the int64
        and the float32 buffer, packed from offset 0 (block_tables last), with its device views and
        copies; made once a shape."""
        key = (num_rows, num_tokens)
        if key not in self.layouts:
            if len(self.layouts) >= LAYOUTS:
                self.layouts.clear()
            self.layouts[key] = self._make_layout(num_rows, *self._layout(num_rows, num_tokens))
        return self.layouts[key]

    def _make_layout(self, num_rows: int, int_slices: dict[str, slice], float_slices: dict[str, slice]) -> Layout:
        target_int, target_float = self.device
        views = {name: target_int[part] for name, part in int_slices.items()}
        views["block_tables"] = views["block_tables"].view(num_rows, self.table_width)
        views |= {name: target_float[part] for name, part in float_slices.items()}
        ints, floats = int_slices["block_tables"].stop, float_slices[FLOAT_FIELDS[-1]].stop
        copies = [((host_int[:ints], target_int[:ints]), (host_float[:floats], target_float[:floats]))
                  for host_int, host_float in self.host] if self.is_cuda else []
        return Layout(int_slices, float_slices, StepInputs(**views), copies)

    def _layout(self, num_rows: int, num_tokens: int) -> tuple[dict[str, slice], dict[str, slice]]:
        sizes = [(name, num_rows) for name in ROW_FIELDS] + [(name, num_tokens) for name in TOKEN_FIELDS]
        sizes.append(("block_tables", num_rows * self.table_width))
        int_slices, offset = {}, 0
        for name, size in sizes:
            int_slices[name] = slice(offset, offset + size)
            offset += size
        float_slices = {name: slice(i * num_rows, (i + 1) * num_rows) for i, name in enumerate(FLOAT_FIELDS)}
        return int_slices, float_slices
