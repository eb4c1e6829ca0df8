"""KV-cache block bookkeeping: which fixed-size blocks of the paged cache each request owns."""
from engine.request import Request


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_block_ids: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def blocks_needed(self, req: Request, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(req.block_ids))

    def can_reserve(self, req: Request, num_tokens: int) -> bool:
        return self.blocks_needed(req, num_tokens) <= self.num_free_blocks

    def reserve(self, req: Request, num_tokens: int) -> None:
        """Make sure `req` owns blocks for positions [0, num_tokens)."""
        need = self.blocks_needed(req, num_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(f"reserve: request {req.request_id} needs {need} blocks, "
                               f"{self.num_free_blocks} free")
        for _ in range(need):
            req.block_ids.append(self.free_block_ids.pop())

    def free(self, req: Request) -> None:
        self.free_block_ids.extend(reversed(req.block_ids))
        req.block_ids = []
