"""KV-cache block bookkeeping: which fixed-size blocks of the paged cache are free. The scheduler
owns each request's list of block ids; this hands blocks out and takes them back."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free_block_ids: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def blocks_needed(self, num_held: int, num_tokens: int) -> int:
        """More blocks a holder of `num_held` blocks needs for positions [0, num_tokens)."""
        return max(0, -(-num_tokens // self.block_size) - num_held)

    def can_reserve(self, num_held: int, num_tokens: int) -> bool:
        return self.blocks_needed(num_held, num_tokens) <= self.num_free_blocks

    def reserve(self, num_held: int, num_tokens: int) -> list[int]:
        """The blocks to add to a holder of `num_held` so it covers positions [0, num_tokens)."""
        need = self.blocks_needed(num_held, num_tokens)
        if need > self.num_free_blocks:
            raise RuntimeError(f"reserve: {need} blocks needed, {self.num_free_blocks} free")
        return [self.free_block_ids.pop() for _ in range(need)]

    def free(self, block_ids: list[int]) -> None:
        self.free_block_ids.extend(reversed(block_ids))
