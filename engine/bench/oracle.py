"""The oracle proposer, for benchmarks only: a known, fixed acceptance on any target.

A random-weight benchmark model makes every real drafter useless, so verify speed could not be
measured at a given acceptance. The oracle replays the target's own greedy continuation, taken
from a plain run of the same workload (an OracleScript, built by `specgate bench --spec oracle`),
and corrupts each draft position independently with probability 1 - a. A verify step then
emits T = 1 + (drafts accepted before the first corrupted one) tokens, and
E[T] = sum_{i=0..k} a^i: a is solved so that this is the requested mean acceptance length tau
(engine/bench/metrics.py's τ). A corrupted draft is a token other than the true one, so the target
(greedy) rejects it; the emitted tokens are the plain run's (lossless).

Whether position p of a request is corrupted is a hash of (the request's key, p): not of the
step, so it does not depend on batching, the runner or how earlier steps went, and each
position's coin is looked at in at most one verify step (the next step starts past it).
"""
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.errors import RequestError, SpecgateError
from engine.proposers import ProposeInput, Proposer, ProposerFactory
from engine.tokenizer import PAD_ID

MASK32 = (1 << 32) - 1


def acceptance_for_tau(tau: float, k: int) -> float:
    """The per-draft acceptance a in [0, 1] with sum_{i=0..k} a^i = tau (bisection: the sum
    rises strictly from 1 at a=0 to k+1 at a=1)."""
    if not 1.0 <= tau <= k + 1:
        raise SpecgateError(f"oracle tau must lie in [1, k+1] = [1, {k + 1}] at k={k} "
                            f"(tokens per verify step: the accepted drafts plus one), got {tau}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(k + 1)) < tau:
            lo = mid
        else:
            hi = mid
    return 1.0 if tau == k + 1 else 0.0 if tau == 1 else (lo + hi) / 2


def tokens_per_step_moments(a: float, k: int) -> tuple[float, float]:
    """Mean and variance of T = 1 + accepted drafts in one verify step of k drafts, when each
    draft is kept with probability a independently: P(T = j) = a^(j-1) (1-a) for j <= k, a^k for k+1."""
    probs = [a ** (j - 1) * (1 - a) for j in range(1, k + 1)] + [a ** k]
    mean = sum(j * p for j, p in zip(range(1, k + 2), probs))
    return mean, sum((j - mean) ** 2 * p for j, p in zip(range(1, k + 2), probs))


@dataclass(frozen=True)
class OracleScript:
    """What a plain greedy run of the workload emitted, per prompt: the continuations to replay,
    and the mean acceptance length tau to hit. `model` is the target folder it was run on."""
    tau: float
    continuations: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    model: str | None = None

    def __post_init__(self):
        if isinstance(self.tau, bool) or not isinstance(self.tau, (int, float)):
            raise SpecgateError(f"oracle tau must be a number, got {self.tau!r}")

    @classmethod
    def from_outputs(cls, outputs, tau: float, model: str | None = None) -> "OracleScript":
        """From LLM.generate's RequestOutputs of a plain greedy run."""
        return cls(tau, {tuple(o.prompt_token_ids): tuple(o.token_ids) for o in outputs}, model)


def _mix32(x):
    """A 32-bit integer hash (two xorshift-multiply rounds) that works alike on Python ints and
    int64 tensors: every product stays below 2**63."""
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & MASK32
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & MASK32
    return x ^ (x >> 16)


def request_key32(rng_key: int, prompt: list[int]) -> int:
    """The key a request's corruption pattern is drawn from: its rng key and its prompt (the bench
    gives every request of a leg the same seed; the prompt tells them apart)."""
    digest = hashlib.blake2b(repr((rng_key, list(prompt))).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def corrupted(key32, position, threshold: int):
    """Whether the draft at `position` is corrupted: hash(key, position) < threshold (a 32-bit
    fraction 1 - a); works on ints and on int64 tensors."""
    return _mix32((key32 ^ ((position * 0x9E3779B1) & MASK32)) & MASK32) < threshold


class OracleProposer(Proposer):
    """Per state slot, the request's whole known sequence (prompt + the plain run's continuation)
    lives on the device, written at admission; propose gathers the next k true tokens and
    replaces the corrupted ones, with no host work."""

    def __init__(self, script: OracleScript, k: int, num_slots: int, max_len: int, vocab_size: int,
                 device: str):
        self.script, self.k, self.vocab_size = script, k, vocab_size
        self.acceptance = acceptance_for_tau(script.tau, k)
        self.threshold = round((1.0 - self.acceptance) * (1 << 32))  # corrupt iff hash < threshold
        self.max_len = max_len
        self.sequence = torch.full((num_slots, max_len), PAD_ID, dtype=torch.long, device=device)
        self.length = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.key = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.pinned = device.startswith("cuda")

    def check_request(self, prompt: list[int], max_tokens: int, temperature: float) -> None:
        """Refuse a request the script cannot replay (the LLM calls this when it is added)."""
        continuation = self.script.continuations.get(tuple(prompt))
        if continuation is None:
            raise RequestError(f"spec='oracle': this prompt ({len(prompt)} tokens) is not in the oracle script; "
                               f"the oracle replays only the prompts of the plain run it was built from")
        if len(continuation) < max_tokens + self.k:
            raise RequestError(f"spec='oracle': the script holds {len(continuation)} tokens of this prompt's "
                               f"continuation; max_tokens={max_tokens} needs {max_tokens + self.k} "
                               f"(max_tokens + k, the drafts of the last verify step)")
        if temperature != 0:
            raise RequestError(f"spec='oracle' replays a greedy continuation: temperature must be 0, got {temperature}")

    def admit(self, slot: int, prompt: list[int], rng_key: int) -> None:
        """Write a request's known sequence into its slot: a host write when it is (re)admitted,
        queued on the stream before the step that prefills it."""
        sequence = (list(prompt) + list(self.script.continuations[tuple(prompt)]))[:self.max_len]
        staged = torch.tensor(sequence, dtype=torch.long, pin_memory=self.pinned)
        scalars = torch.tensor([len(sequence), request_key32(rng_key, prompt)], dtype=torch.long,
                               pin_memory=self.pinned)
        self.sequence[slot, :len(sequence)].copy_(staged, non_blocking=True)
        self.length[slot].copy_(scalars[0], non_blocking=True)
        self.key[slot].copy_(scalars[1], non_blocking=True)

    def propose(self, inp: ProposeInput) -> tuple[torch.Tensor, torch.Tensor, None]:
        slots, committed = inp.slots, inp.num_committed
        positions = committed[:, None] + torch.arange(self.k, device=slots.device)          # [R, k]
        true = self.sequence[slots[:, None], positions.clamp(max=self.max_len - 1)]
        key = self.key[slots][:, None]
        bad = corrupted(key, positions, self.threshold)
        shift = 1 + _mix32((key ^ positions ^ 0x5BD1E995) & MASK32) % (self.vocab_size - 1)
        drafts = torch.where(bad, (true + shift) % self.vocab_size, true)
        num_draft = (self.length[slots] - committed).clamp(0, self.k)
        drafts = torch.where(torch.arange(self.k, device=slots.device) < num_draft[:, None], drafts, PAD_ID)
        return drafts, num_draft, None


def oracle_proposer(script: OracleScript) -> ProposerFactory:
    """The factory an LLM builds its oracle from: LLM(..., spec="oracle", proposer=oracle_proposer(script)).
    Refuses a script that is not an OracleScript, a tau outside [1, k+1], and a script run on
    another target folder."""
    if not isinstance(script, OracleScript):
        raise SpecgateError(f"the oracle needs an OracleScript, got {type(script).__name__}")

    def build(cfg, model_dir, vocab_size: int) -> OracleProposer:
        if script.model is not None and Path(script.model).resolve() != Path(model_dir).resolve():
            raise SpecgateError(f"the oracle script was built from a plain run of {script.model}, "
                                f"not of this model {model_dir}")
        # One row per state slot (the runner's: max_num_seqs, and the padding rows' last one).
        return OracleProposer(script, cfg.k, cfg.max_num_seqs + 1,
                              cfg.blocks_per_seq * cfg.block_size + cfg.k + 1, vocab_size, cfg.device)
    return build
