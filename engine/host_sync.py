"""The engine's deliberate host waits, declared.

The async runner's host reads a step's results one step late, after the next step is queued,
and a CUDA graph capture synchronises once per bucket. Those waits are by design; any other
host read inside the step loop stalls the device. Each deliberate wait runs inside
`DeclaredSyncs.allow(kind)`: it is counted by kind, marked while it runs (so a checker, the
no-sync gate, can tell it from any other read), and on CUDA runs with torch's sync debug mode
switched off, so the rest of the loop can run under torch.cuda.set_sync_debug_mode("error").
"""
from collections import Counter
from contextlib import contextmanager

import torch


class DeclaredSyncs:
    def __init__(self):
        self.counts: Counter[str] = Counter()
        self.active: str | None = None   # the kind of the declared wait running now, if any

    @contextmanager
    def allow(self, kind: str):
        self.counts[kind] += 1
        outer, self.active = self.active, kind
        mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
        if mode:
            torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            if mode:
                torch.cuda.set_sync_debug_mode(mode)
            self.active = outer
