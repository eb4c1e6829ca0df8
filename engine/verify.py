"""Lossless verification of draft tokens, batched on the device (Leviathan et al. 2023).

Row r of a step carries num_draft[r] <= W - 1 draft tokens x_1..x_n drawn from q, and the
target's logits at W rows (the last committed token, then each draft). Symbols as in the paper:
p is the target distribution, q the drafter's; both are processed by `processed_probs`, so
temperature, top-k and top-p apply identically. Draft x_j is accepted with probability
min(1, p(x_j) / q(x_j)); at the first rejection one token is drawn from norm(max(0, p - q));
if every draft is accepted, a bonus token is drawn from p at the next row. A deterministic
drafter (ngram) has one-hot q. Greedy rows have one-hot p, which makes this the
longest-prefix match followed by the target's argmax.

A row with no drafts (prefill, plain decode) simply draws its one token from p.
"""
import torch

from engine.sampling import STREAM_ACCEPT, SamplingTensors, keyed_uniform, sample_from_probs


def verify(logits: torch.Tensor, draft_token_ids: torch.Tensor, num_draft: torch.Tensor,
           draft_probs: torch.Tensor | None, sampling: SamplingTensors,
           first_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, W, V]; draft_token_ids [R, W-1]; num_draft [R]; draft_probs [R, W-1, V] or None;
    sampling: each row's parameters; first_position [R]: the position of the token drawn at row 0.

    Returns sampled [R, W] (accepted drafts, then the correction or bonus token; -1 after) and
    num_accepted [R].
    """
    num_reqs, width, vocab = logits.shape
    rows = torch.arange(num_reqs, device=logits.device)
    keys = sampling.keys
    p = sampling.probs(logits)
    draft_pos = torch.arange(width - 1, device=logits.device)
    is_real_draft = draft_pos < num_draft[:, None]
    drafts = draft_token_ids.clamp(0, vocab - 1)
    p_x = p[:, :-1].gather(-1, drafts[..., None]).squeeze(-1)
    q_x = (draft_probs.gather(-1, drafts[..., None]).squeeze(-1) if draft_probs is not None
           else torch.ones_like(p_x))
    u = keyed_uniform(keys[:, None], first_position[:, None] + draft_pos, STREAM_ACCEPT, 1)[..., 0]
    ratio = p_x / q_x.clamp_min(1e-30)
    accepted = is_real_draft & (u < ratio)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)

    # The token after the accepted prefix: residual on a rejection, else the bonus from p.
    p_next = p[rows, num_accepted]
    if draft_probs is not None and width > 1:
        q_next = draft_probs[rows, num_accepted.clamp(max=width - 2)]
    else:
        q_next = torch.nn.functional.one_hot(drafts[rows, num_accepted.clamp(max=max(width - 2, 0))]
                                             if width > 1 else torch.zeros_like(rows), vocab).to(p.dtype)
    residual = (p_next - q_next).clamp_min(0)
    rejected = (num_accepted < num_draft) & (residual.sum(-1) > 0)
    # The exponential race draws in proportion to its weights, so the residual needs no normalising.
    next_dist = torch.where(rejected[:, None], residual, p_next)
    next_token = sample_from_probs(next_dist, keys, first_position + num_accepted)

    out_pos = torch.arange(width, device=logits.device)
    sampled = torch.full((num_reqs, width), -1, dtype=torch.long, device=logits.device)
    sampled[:, :-1] = torch.where(out_pos[:-1] < num_accepted[:, None], drafts, -1)
    sampled[rows, num_accepted] = next_token
    return sampled, num_accepted
