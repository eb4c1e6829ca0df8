"""Sampling parameters, and the batched samplers that turn logits into tokens on the device.

Randomness is counter-based: every random number is a hash of (request key, token position,
stream). A seeded request's tokens are a function of its prompt, its SamplingParams and the
engine's model, dtype, drafter and k, never of which other requests share the batch, which
runner or arm ran it, or whether it was preempted and resumed (up to floating-point near-ties:
another batch shape or a recomputed prefill can round the logits differently in their last bits).
Preemption moves no draw because a resumed request verifies the drafts it held when preempted,
with the same q, at the same positions (engine/scheduler.py resume_drafts): drawn straight from
p instead, its resume point, and for the block drafter the blocks after it, took other random
decisions. The drafter and k do change the tokens: each run is distributed as the target, but a
position drawn through a draft and its accept decision is another draw than one from p.
A seeded request's 62-bit key is a hash (splitmix64) of its seed, so every bit of the seed
counts; an unseeded request draws its key from the engine's generator.
"""
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.errors import RequestError

# A logits processor sees the request's full output so far (host list) and one logits row.
LogitsProcessor = Callable[[list[int], torch.Tensor], torch.Tensor]

STREAM_SAMPLE, STREAM_ACCEPT, STREAM_DRAFT = 0, 1, 2
_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
MAX_SEED = 1 << 64
MAX_TOP_K = (1 << 63) - 1  # top_k travels to the device as int64
# Below this, logits / T overflows float32 for ordinary logits and softmax gives NaN; such a
# temperature is treated as greedy (vLLM does the same below its _SAMPLING_EPS, 1e-5).
MIN_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    temperature: float = 1.0          # 0 (or below MIN_TEMPERATURE) means greedy
    top_k: int = -1                   # -1 or 0: off
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logits_processors: list[LogitsProcessor] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise RequestError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not -1 <= self.top_k <= MAX_TOP_K:
            raise RequestError(f"top_k must be -1 (off), 0 (off) or a positive integer below 2**63, "
                               f"got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) \
                or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < MAX_SEED):
            raise RequestError(f"seed must be None or an integer in [0, 2**64), got {self.seed!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise RequestError(f"stop_token_ids must be integers, got {self.stop_token_ids!r}")
        if not all(callable(p) for p in self.logits_processors):
            raise RequestError("logits_processors must be callables (output_ids, logits_row) -> logits_row")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SamplingTensors:
    """A step's per-row sampling parameters on the device, one [R] tensor each; padding rows
    are greedy. verify and the proposers read them by name."""
    temperature: torch.Tensor     # float32; 0 means greedy
    top_k: torch.Tensor           # long; -1 or 0: off
    top_p: torch.Tensor           # float32
    keys: torch.Tensor            # long; the request's stream key (see request_key)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """processed_probs of logits [R, W, V] with row r's parameters at every one of its W rows."""
        return processed_probs(logits, self.temperature[:, None], self.top_k[:, None], self.top_p[:, None])


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """An avalanche hash on int64 tensors holding 32-bit values; the multipliers are < 2**31,
    so no product overflows int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _MASK32
    return x ^ (x >> 16)


def keyed_uniform(keys: torch.Tensor, positions: torch.Tensor, stream: int, width: int) -> torch.Tensor:
    """Uniform numbers in (0, 1), shape [*keys.shape, width], a pure function of the inputs."""
    h = _mix32(keys & _MASK32) ^ _mix32((keys >> 32) & _MASK32)
    h = _mix32(h ^ _mix32(positions & _MASK32))
    h = _mix32(h ^ (stream * 0x9E3779B + 0x632BE5A))
    lanes = _mix32(torch.arange(width, device=keys.device, dtype=torch.int64) + 0x5BD1E995)
    u = _mix32(h[..., None] ^ lanes)
    # 23 bits, so (n + 0.5) / 2**23 is exact in float32 and at most 1 - 2**-24. With 24 bits the
    # top value rounded to 1.0, and -log(1.0) = 0 let a zero-probability token win the race.
    return ((u >> 9).float() + 0.5) / float(1 << 23)


def sample_from_probs(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                      stream: int = STREAM_SAMPLE) -> torch.Tensor:
    """Exponential race (equivalent to Gumbel-max): argmax p_i / E_i with E_i ~ Exp(1)."""
    exp_noise = -torch.log(keyed_uniform(keys, positions, stream, probs.shape[-1]))
    return torch.argmax(probs / exp_noise, dim=-1)


def processed_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor) -> torch.Tensor:
    """Softmax of logits / temperature restricted to top-k and top-p, per row.

    logits [..., V]; temperature, top_k, top_p broadcast to logits.shape[:-1]. Greedy rows
    (temperature 0) get a one-hot distribution on the argmax, so p and q are always computed
    by this one function and processed identically.

    Both cuts are thresholds on values, never positions in the sort: top-k keeps every token whose
    logit reaches the k-th largest (all the tokens tied there stay, as in vLLM and transformers);
    top-p keeps the shortest run of the largest renormalised probabilities whose mass reaches top_p,
    and every token tied with the last one kept. So the result depends on the row's values alone:
    the order a sort gives equal values (which differs between devices, between sort and topk, and
    is unspecified) cannot change it, and bfloat16's frequent ties cut p and q the same way.
    """
    greedy = temperature < MIN_TEMPERATURE
    scaled = logits / torch.where(greedy, 1.0, temperature)[..., None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).expand(scaled.shape[:-1])
    kth_largest = sorted_logits.gather(-1, k[..., None] - 1)
    in_top_k = sorted_logits >= kth_largest
    sorted_probs = torch.softmax(sorted_logits.masked_fill(~in_top_k, -math.inf), dim=-1)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    # top_p 1.0 keeps everything: the float32 running sum can round to 1.0 before the tail.
    reaching = in_top_k & ((mass_before < top_p[..., None]) | (rank == 0) | (top_p[..., None] >= 1.0))
    # The run is a prefix of the sort; its last value is the cut, so its whole tie group stays.
    smallest_kept = sorted_logits.gather(-1, reaching.sum(-1, keepdim=True) - 1)
    sorted_probs = torch.softmax(sorted_logits.masked_fill(sorted_logits < smallest_kept, -math.inf), dim=-1)
    probs = torch.empty_like(sorted_probs).scatter_(-1, order, sorted_probs)
    one_hot = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(probs.dtype)
    return torch.where(greedy[..., None], one_hot, probs)


def request_key(seed: int | None, fallback: torch.Generator) -> int:
    """The request's stream key: a hash of its seed when seeded, else from the engine's generator.

    Not torch.Generator().manual_seed(seed): that keeps only the seed's low 32 bits, so seeds
    1 and 2**32 + 1 gave the same stream."""
    if seed is not None:
        return _splitmix64(seed) >> 2
    return int(torch.randint(0, 1 << 62, (1,), generator=fallback, device=fallback.device).item())


def _splitmix64(x: int) -> int:
    """A bijection on 64-bit integers with full avalanche (Steele et al.'s SplitMix64 finaliser)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def guarded_processors(req) -> list[LogitsProcessor]:
    """The request's logits processors, each wrapped so that one which raises, or returns something
    other than a logits row of the same shape, or a row where no token is possible (all NaN or
    -inf, where argmax would emit token 0), fails this request alone: it records the error (`req.fail`)
    and leaves the row as it was, and the engine drops the request's result for the step."""
    def guard(proc: LogitsProcessor) -> LogitsProcessor:
        def run(output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
            if req.error is not None:
                return row
            try:
                out = proc(output_ids, row)
                if not isinstance(out, torch.Tensor) or out.shape != row.shape:
                    raise TypeError(f"returned {type(out).__name__} {getattr(out, 'shape', '')}, "
                                    f"not a logits row of shape {tuple(row.shape)}")
                if not bool((out > float("-inf")).any()):  # NaN compares false too
                    raise ValueError("returned a row with every logit NaN or -inf: no token can be chosen "
                                     "(transformers raises here too); leave at least one token finite")
                return out
            except Exception as e:  # noqa: BLE001 - any failure of user code fails its request only
                req.fail(f"logits processor {getattr(proc, '__name__', proc)!r} failed: {type(e).__name__}: {e}")
                return row
        return run
    return [guard(p) for p in req.params.logits_processors]
