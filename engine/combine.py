"""The combine: a step's query tokens, positions and sequence lengths, assembled on the device.

A row is either host-fed (its ids, positions and length come from the plan, as the host knows
them) or device-fed (the async runner, or the sync one for a row whose last step the host has
not read): then its first token is its last committed one and its positions and length follow
the committed count the previous step wrote into the device state. Independently, a row's last
`draft_slots` query tokens take the drafts the previous step's propose wrote (a verify row's
after its first token, a resumed prefill's after its history). The gates named combine,
emit-count and predicate-split judge exactly this.

It reads the device state and writes nothing, so with EngineConfig.compile it runs as one
inductor graph (about twenty small gathers, compares and wheres a step otherwise, each a kernel
launch); the runner's commit, which writes the state, stays eager.
"""
import torch


def combine_inputs(slots: torch.Tensor, query_lens: torch.Tensor, spec_width: torch.Tensor,
                   device_fed: torch.Tensor, draft_slots: torch.Tensor, host_token_ids: torch.Tensor,
                   host_positions: torch.Tensor, host_seq_lens: torch.Tensor, num_committed: torch.Tensor,
                   token_ids: torch.Tensor, draft_token_ids: torch.Tensor, k: int,
                   num_tokens: int) -> tuple[torch.Tensor, ...]:
    """The step's query_start_loc [R+1] (where each row's query starts in the T tokens), token_slot
    [T] (each query token's state slot), input_ids [T], positions [T] and seq_lens [R] (after the
    step). The row columns are StepInputs' (device_fed as 0/1); num_committed, token_ids and
    draft_token_ids are the device state's."""
    num_reqs, dev = slots.numel(), slots.device
    query_start_loc = torch.nn.functional.pad(query_lens.cumsum(0), (1, 0))
    fed_row = device_fed != 0
    query_req = torch.repeat_interleave(torch.arange(num_reqs, device=dev), query_lens, output_size=num_tokens)
    offset = torch.arange(num_tokens, device=dev) - query_start_loc[query_req]
    draft_index = offset - (query_lens - draft_slots)[query_req]
    token_slot = slots[query_req]
    committed = num_committed[token_slot]
    last_token = token_ids[token_slot, (committed - 1).clamp_min(0)]
    if k:
        draft = draft_token_ids[token_slot, draft_index.clamp(0, k - 1)]
        device_ids = torch.where(offset == 0, last_token, draft)
    else:
        device_ids = last_token
    fed_token = fed_row[query_req]
    input_ids = torch.where(fed_token | (draft_index >= 0), device_ids, host_token_ids)
    positions = torch.where(fed_token, committed - 1 + offset, host_positions)
    seq_lens = torch.where(fed_row, num_committed[slots] + spec_width, host_seq_lens)
    return query_start_loc, token_slot, input_ids, positions, seq_lens
