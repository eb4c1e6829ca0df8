"""The graph arm's context buckets (engine/step_plan.py): powers of two blocks below the block
table's width, then the whole table, for SDPA; one bucket, the table, for flex."""
import pytest

from engine.config import EngineConfig
from engine.step_plan import StepPlanner, context_buckets

BLOCK = 4


@pytest.mark.parametrize("table_width, buckets", [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_context_buckets_are_powers_of_two_blocks_below_the_table_then_the_table(table_width, buckets):
    """A table of a power-of-two width ends on itself once, not twice."""
    assert context_buckets(table_width, BLOCK) == [BLOCK * b for b in buckets]


@pytest.mark.parametrize("backend, buckets", [("sdpa", [1, 2, 4, 8]), ("flex", [8])])
def test_only_the_sdpa_backend_buckets_the_context(backend, buckets):
    """flex reads as many blocks as each request has, through its block mask: one bucket, the table."""
    cfg = EngineConfig(model="unused", spec="ngram", num_spec_tokens=2, block_size=BLOCK, max_num_seqs=4,
                       max_model_len=24, max_num_batched_tokens=64, attention_backend=backend)
    planner = StepPlanner(cfg)  # 24 positions and the steps in flight (max_positions): 8 blocks
    assert planner.table_width == 8 and planner.context_buckets == [BLOCK * b for b in buckets]
