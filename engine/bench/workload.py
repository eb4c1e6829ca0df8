"""A workload: the requests of a run (prompt, token budget, arrival step, sampling) and a
fingerprint that names it in reports. The bench and the gates both build theirs here.

Prompts are text, encoded by the model folder's own tokenizer when the LLM runs them, or token
ids, fed as they are.
"""
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.sampling import SamplingParams

Prompt = str | tuple[int, ...]


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]
    max_tokens: tuple[int, ...]              # per request
    arrival_steps: tuple[int, ...] = ()      # per request; empty: every request at step 0
    host_history: tuple[bool, ...] = ()      # per request: it gets the host-history logits processor
    temperature: float = 0.0
    seeds: tuple[int | None, ...] = ()       # per request; empty: unseeded
    stop_token_ids: tuple[tuple[int, ...], ...] = ()   # per request; empty: none
    ignore_eos: tuple[bool, ...] = ()        # per request; empty: every request stops at EOS

    def __post_init__(self):
        fix = object.__setattr__
        fix(self, "prompts", tuple(p if isinstance(p, str) else tuple(p) for p in self.prompts))
        fix(self, "stop_token_ids", tuple(tuple(stops) for stops in self.stop_token_ids))
        for name in ("max_tokens", "arrival_steps", "host_history", "seeds", "stop_token_ids", "ignore_eos"):
            fix(self, name, tuple(getattr(self, name)))
            if getattr(self, name) and len(getattr(self, name)) != self.num_reqs:
                raise ValueError(f"workload: {len(getattr(self, name))} {name} for {self.num_reqs} prompts")
        if not self.max_tokens and self.num_reqs:
            raise ValueError("workload: max_tokens is required per request")

    @classmethod
    def uniform(cls, prompts: Sequence[Prompt], max_tokens: int, temperature: float = 0.0) -> "Workload":
        """Every request with the same budget and temperature, all at step 0 (the bench's)."""
        return cls(tuple(prompts), (max_tokens,) * len(prompts), temperature=temperature)

    @property
    def num_reqs(self) -> int:
        return len(self.prompts)

    def prompt_list(self) -> list:
        """The prompts as LLM.generate takes them (token ids as lists)."""
        return [p if isinstance(p, str) else list(p) for p in self.prompts]

    def arrivals(self) -> list[int]:
        return list(self.arrival_steps or (0,) * self.num_reqs)

    def params(self, host_processor: Callable | None = None, seed: int | None = None,
               ignore_eos: bool = False) -> list[SamplingParams]:
        """One SamplingParams per request. `host_processor`: the logits processor given to the
        host-history requests; `seed`: for every request without its own; `ignore_eos`: for every
        request, or-ed with the request's own."""
        if any(self.host_history) and host_processor is None:
            raise ValueError("workload: host-history requests need a host_processor")
        history = self.host_history or (False,) * self.num_reqs
        seeds = self.seeds or (None,) * self.num_reqs
        stops = self.stop_token_ids or ((),) * self.num_reqs
        own_ignore_eos = self.ignore_eos or (False,) * self.num_reqs
        return [SamplingParams(temperature=self.temperature, max_tokens=m, ignore_eos=ignore_eos or ig,
                               seed=seed if s is None else s, stop_token_ids=list(stop),
                               logits_processors=[host_processor] if h else [])
                for m, h, s, stop, ig in zip(self.max_tokens, history, seeds, stops, own_ignore_eos)]

    def max_tokens_json(self) -> int | list[int]:
        """One number when every request has the same budget (the bench's form), else the list."""
        return self.max_tokens[0] if len(set(self.max_tokens)) == 1 else list(self.max_tokens)

    def fingerprint(self) -> str:
        """sha256 of the workload's content, 16 hex digits; parts at their defaults are left out, so
        a uniform workload's fingerprint is the one the bench has always written."""
        body = {"prompts": [p if isinstance(p, str) else list(p) for p in self.prompts],
                "max_tokens": self.max_tokens_json(), "temperature": self.temperature}
        if any(self.arrival_steps):
            body["arrival_steps"] = list(self.arrival_steps)
        if any(self.host_history):
            body["host_history"] = list(self.host_history)
        if any(s is not None for s in self.seeds):
            body["seeds"] = list(self.seeds)
        if any(self.stop_token_ids):
            body["stop_token_ids"] = [list(stops) for stops in self.stop_token_ids]
        if any(self.ignore_eos):
            body["ignore_eos"] = list(self.ignore_eos)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
