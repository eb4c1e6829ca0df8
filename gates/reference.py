"""The absolute reference: a naive greedy decoder, the oracle beside the differential checks.

Spec against plain, async against sync: a defect on a path both sides share (the finish rule,
the stop tokens, the context limit) is invisible to every such comparison. The reference shares
none of the engine's request path: `forward_dense` over the whole sequence, one request at a
time, no KV cache, no batching, no speculation, its own finish rule. It says which greedy tokens
a request emits and how and when it finishes (stop_token_ids, EOS unless ignore_eos, max_tokens,
max_model_len), as the engine documents them.

A request's greedy stream does not depend on when it stops, so the stream is decoded once per
(prompt, logits processors) and extended on demand; every stop rule is applied to that cached
stream. One decoder lives for a gates session (the `reference` fixture), so it stays cheap.

In bfloat16 exact equality across batch shapes is not possible (near-ties swap), so a bfloat16
run is judged teacher-forced instead: each greedy token against the reference's logits for its
own prefix, within a near-tie of BF16_TIE_ULPS (near_tie_difference).
"""
import math
from dataclasses import dataclass

import torch

from engine import SamplingParams
from gates.compare import Difference, step_of, token_difference


@dataclass(frozen=True)
class Expected:
    token_ids: list[int]
    finish_reason: str          # "stop", "length" or "context"
    trigger: str                # "stop_token_ids", "eos", "max_tokens" or "max_model_len"
    eos_ignored: bool = False   # an EOS id was emitted and passed over (ignore_eos)


class ReferenceDecoder:
    def __init__(self, model, eos_token_ids):
        self.model = model
        self.eos_token_ids = frozenset(eos_token_ids)
        self._streams: dict[tuple, list[int]] = {}
        self.forwards = 0

    @torch.no_grad()
    def stream(self, prompt_ids: list[int], processors: tuple, length: int, hint: list[int] = ()) -> list[int]:
        """The first `length` greedy tokens after the prompt, ignoring every stop rule.

        `hint` (the engine's output) only saves time: the model is causal, so one dense forward
        over prompt + hint gives, at every position, the token naive decoding would produce from
        that prefix; the stream takes the hint's tokens while they agree with those predictions,
        then the first one that disagrees, then decodes one token per dense forward."""
        out = self._streams.setdefault((tuple(prompt_ids), processors), [])
        hint = list(hint[:length])
        if len(out) < length and len(hint) > len(out) and hint[:len(out)] == out:
            logits = self._logits(list(prompt_ids) + hint)
            while len(out) < length:
                token = self._next(logits[len(prompt_ids) + len(out) - 1], processors, out)
                out.append(token)
                if len(out) > len(hint) or token != hint[len(out) - 1]:
                    break
        while len(out) < length:
            out.append(self._next(self._logits(list(prompt_ids) + out)[-1], processors, out))
        return out[:length]

    def _logits(self, ids: list[int]) -> torch.Tensor:
        self.forwards += 1
        logits, _ = self.model.forward_dense(torch.tensor([ids], device=self.model.lm_head.weight.device))
        return logits[0]

    @staticmethod
    def _next(row: torch.Tensor, processors: tuple, out: list[int]) -> int:
        row = row.clone()
        for proc in processors:
            row = proc(list(out), row)
        return int(row.argmax())

    def expected(self, prompt_ids: list[int], params: SamplingParams, max_model_len: int,
                 hint: list[int] = ()) -> Expected:
        """The tokens a greedy request emits and why it ends, by the documented rule: a token in
        stop_token_ids, or an EOS id unless ignore_eos, ends it with "stop" (the token is
        emitted); else reaching max_tokens outputs ends it with "length", and reaching
        max_model_len tokens in all before that ends it with "context"."""
        if not params.is_greedy:
            raise ValueError("the reference decoder judges greedy requests only")
        room = min(params.max_tokens, max_model_len - len(prompt_ids))
        tokens = self.stream(prompt_ids, tuple(params.logits_processors), room, hint)
        for i, token in enumerate(tokens):
            if token in params.stop_token_ids:
                return Expected(tokens[:i + 1], "stop", "stop_token_ids")
            if token in self.eos_token_ids and not params.ignore_eos:
                return Expected(tokens[:i + 1], "stop", "eos")
        by_max_tokens = params.max_tokens <= max_model_len - len(prompt_ids)
        trigger = "max_tokens" if by_max_tokens else "max_model_len"
        return Expected(tokens, "length" if by_max_tokens else "context", trigger,
                        any(t in self.eos_token_ids for t in tokens))


def reference_difference(reference: ReferenceDecoder, run, max_model_len: int) -> tuple[Difference | None, set]:
    """Every greedy request of `run` (a gates.workloads.Run) against the reference: its tokens,
    then its finish reason. Returns the first Difference (or None) and the set of triggers that
    ended the requests ("ignore_eos" too when a request passed over an EOS), so a gate can
    assert the stop rules it means to cover really fired."""
    params = run.sampling_params
    expected, triggers = {}, set()
    judged = [(o, p) for o, p in zip(run.outputs, params) if p.is_greedy]
    for out, p in judged:
        e = reference.expected(out.prompt_token_ids, p, max_model_len, out.token_ids)
        expected[out.request_id] = e
        triggers.add(e.trigger)
        if e.eos_ignored:
            triggers.add("ignore_eos")
    greedy_run = _Outputs([o for o, _ in judged], run.trace)
    diff = token_difference({rid: e.token_ids for rid, e in expected.items()}, greedy_run)
    if diff is not None:
        diff.what = "output token (vs the reference decoder)"
        return diff, triggers
    for out, _ in judged:
        want = expected[out.request_id].finish_reason
        if out.finish_reason != want:
            position = len(out.prompt_token_ids) + len(out.token_ids) - 1
            return Difference("finish reason (vs the reference decoder)",
                              step_of(run.trace, out.request_id, position), out.request_id, position,
                              want, out.finish_reason), triggers
    return None, triggers


@dataclass
class _Outputs:
    outputs: list
    trace: list


# bfloat16 keeps 8 significant bits, so two logits a near-tie apart in one batch shape can swap in
# another (plain decode, a verify window, the dense reference): a bfloat16 greedy token is judged
# right when its logit is within this many bfloat16 units in the last place of the row's maximum.
BF16_TIE_ULPS = 2


def bf16_tolerance(row_max: float) -> float:
    """BF16_TIE_ULPS units in the last place of bfloat16 at |row_max|."""
    return BF16_TIE_ULPS * 2.0 ** (math.floor(math.log2(max(abs(row_max), 2.0 ** -126))) - 7)


@torch.no_grad()
def teacher_forced_logits(model, prompt_ids: list[int], token_ids: list[int]) -> torch.Tensor:
    """The reference's logits for each of `token_ids` given everything before it: one dense
    forward over prompt + tokens (no cache, no batching), rows [len(token_ids), V]."""
    ids = list(prompt_ids) + list(token_ids[:-1])
    logits, _ = model.forward_dense(torch.tensor([ids], device=model.lm_head.weight.device))
    return logits[0, len(prompt_ids) - 1:].float()


def near_tie_difference(logits: torch.Tensor, token_ids: list[int], request_id: int,
                        prompt_len: int) -> tuple[Difference | None, int]:
    """Every greedy token against the reference's logits for it (teacher_forced_logits): the
    token's logit must be within bf16_tolerance of the row's maximum. Returns the first token
    beyond it (or None) and how many tokens were near-ties other than the argmax."""
    ties = 0
    for i, token in enumerate(token_ids):
        row = logits[i]
        top, gap = float(row.max()), float(row.max() - row[token])
        if gap > bf16_tolerance(top):
            return Difference(f"output token (vs the reference decoder, beyond a bfloat16 near-tie of "
                              f"{BF16_TIE_ULPS} ulps; logit gap {gap:.4f})", None, request_id, prompt_len + i,
                              int(row.argmax()), token), ties
        ties += gap > 0
    return None, ties


def bigram_repeats(tokens: list[int], start: int) -> bool:
    """Whether some token at or after `start` completes a bigram seen earlier in `tokens`: only
    then can a prompt-lookup (n-gram) draft, which copies what followed an earlier match of the
    current suffix, equal the greedy token (a match of n >= 1 tokens followed by the same token
    is a repeated bigram)."""
    seen = {(a, b) for a, b in zip(tokens[:start - 1], tokens[1:start])} if start > 1 else set()
    for i in range(max(start, 1), len(tokens)):
        pair = (tokens[i - 1], tokens[i])
        if pair in seen:
            return True
        seen.add(pair)
    return False


def dtype_difference(llm, dtype: torch.dtype) -> Difference | None:
    """The engine really runs in `dtype`: every weight and every KV cache, not only its config."""
    got = {t.dtype for t in (*llm.model.parameters(), *llm.runner.kv_caches)}
    return None if got == {dtype} else Difference("engine dtype (weights and KV cache)", None, None, None,
                                                  str(dtype), sorted(map(str, got)))
