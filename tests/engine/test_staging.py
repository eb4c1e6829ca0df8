"""The staging buffers (engine/staging.py): a step that does not fit is refused before anything is
written, with the sizes in the message; one that fits comes back field by field."""
import pytest
import torch

from engine.host_sync import DeclaredSyncs
from engine.staging import FLOAT_FIELDS, ROW_FIELDS, TOKEN_FIELDS, InputStaging
from engine.step_io import StepInputs

MAX_ROWS, MAX_TOKENS, WIDTH = 4, 10, 3


def columns(num_rows: int, num_tokens: int) -> StepInputs[list]:
    cols = {name: [i + 10 * k for i in range(num_rows)] for k, name in enumerate(ROW_FIELDS)}
    cols |= {name: [i + 100 * k for i in range(num_tokens)] for k, name in enumerate(TOKEN_FIELDS, 1)}
    cols |= {name: [0.5 * i for i in range(num_rows)] for name in FLOAT_FIELDS}
    return StepInputs(**cols, block_tables=[[r * WIDTH + j for j in range(WIDTH)] for r in range(num_rows)])


@pytest.mark.parametrize("num_rows, num_tokens", [(MAX_ROWS + 1, 1), (1, MAX_TOKENS + 1),
                                                  (MAX_ROWS + 1, MAX_TOKENS + 1)],
                         ids=["rows-over", "tokens-over", "both-over"])
def test_a_step_past_either_buffer_is_refused_with_its_sizes(num_rows, num_tokens):
    staging = InputStaging(MAX_ROWS, MAX_TOKENS, WIDTH, "cpu", DeclaredSyncs())
    with pytest.raises(RuntimeError) as e:
        staging.upload(columns(num_rows, num_tokens), num_rows, num_tokens)
    assert str(e.value) == (f"a step of {num_rows} rows and {num_tokens} tokens exceeds the staging buffers "
                            f"({MAX_ROWS} rows, {MAX_TOKENS} tokens)")


def test_a_step_at_the_limits_comes_back_field_by_field():
    staging = InputStaging(MAX_ROWS, MAX_TOKENS, WIDTH, "cpu", DeclaredSyncs())
    cols = columns(MAX_ROWS, MAX_TOKENS)
    views = staging.upload(cols, MAX_ROWS, MAX_TOKENS)
    for name in (*ROW_FIELDS, *TOKEN_FIELDS, *FLOAT_FIELDS, "block_tables"):
        assert getattr(views, name).tolist() == getattr(cols, name), name
    assert views.temperature.dtype == torch.float32 and views.slots.dtype == torch.long


class CopyEvent:
    """A host buffer's last-copy event (torch.cuda.Event needs CUDA), still running or done."""
    def __init__(self, done: bool, declared: DeclaredSyncs):
        self.done, self.declared, self.waited_as = done, declared, []

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited_as.append(self.declared.active)


@pytest.mark.parametrize("done", [False, True], ids=["copy-running", "copy-done"])
def test_a_host_buffer_is_refilled_only_after_its_last_copy_inside_a_declared_wait(done):
    """The ring's rule: a buffer whose copy is still running is waited for, and that wait is the
    declared 'staging buffer reuse' (the no-sync gate tells it from a stray sync by that name);
    a buffer whose copy has finished is refilled at once, with no wait and nothing counted."""
    declared = DeclaredSyncs()
    staging = InputStaging(MAX_ROWS, MAX_TOKENS, WIDTH, "cpu", declared)
    staging.copied[0] = event = CopyEvent(done, declared)
    views = staging.upload(columns(2, 3), 2, 3)
    assert event.waited_as == ([] if done else ["staging buffer reuse"])
    assert declared.counts == ({} if done else {"staging buffer reuse": 1}) and declared.active is None
    assert views.slots.tolist() == [0, 1]


def test_a_shape_seen_again_gets_the_same_device_tensors_with_the_new_values():
    """A shape's views are made once (engine/staging.py, Layout): a graph bucket's inputs stay
    where its graph was captured, and a step pays no tensor op to find them."""
    staging = InputStaging(MAX_ROWS, MAX_TOKENS, WIDTH, "cpu", DeclaredSyncs())
    first = staging.upload(columns(2, 3), 2, 3)
    other = staging.upload(columns(3, 5), 3, 5)
    cols = columns(2, 3)
    cols.slots, cols.host_token_ids = [7, 8], [4, 5, 6]
    again = staging.upload(cols, 2, 3)
    assert again is first and other is not first
    assert again.slots.tolist() == [7, 8] and again.host_token_ids.tolist() == [4, 5, 6]
    assert again.block_tables.shape == (2, WIDTH) and again.top_p.tolist() == cols.top_p
