"""`specgate bench`: throughput and acceptance per leg, on prompts from held-out stdlib files.

A leg is one pass of the whole workload at one concurrency (max_num_seqs). Every leg records
both axes, throughput and acceptance, and ONE warm-leg predicate decides which legs count for
both, so the two axes always fold over the same population of legs.
"""
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.metrics import Acceptance
from engine.workload import Workload


@dataclass
class Leg:
    concurrency: int
    index: int
    prompt_tokens: int
    completion_tokens: int
    start: float
    end: float
    seconds: float
    tokens_per_s: float
    acceptance: dict
    warm: bool


def heldout_workload(corpus, num_prompts: int = 8, prompt_bytes: int = 160, max_tokens: int = 64,
                     temperature: float = 0.0) -> Workload:
    """Prompts cut at a line start inside the corpus's held-out files (never trained on); `corpus`:
    fixtures.corpus.load_corpus(), handed in by the caller."""
    prompts = []
    for rel in corpus.heldout_files:
        text = corpus.read(rel).decode("utf-8", errors="replace")
        start = text.find("\ndef ")
        start = start + 1 if start >= 0 else 0
        snippet = text[start:start + prompt_bytes]
        if len(snippet) >= prompt_bytes // 2:
            prompts.append(snippet)
        if len(prompts) == num_prompts:
            break
    return Workload.uniform(prompts, max_tokens, temperature)


def is_warm(leg_index: int, warmup_legs: int) -> bool:
    """The one warm-leg predicate: the first `warmup_legs` legs of a concurrency pay one-time
    costs (allocation, caches) and count for neither axis."""
    return leg_index >= warmup_legs


def fold(legs: list[Leg]) -> dict:
    """Fold the warm legs of each concurrency: throughput and acceptance over the same legs."""
    out = {}
    for c in sorted({leg.concurrency for leg in legs}):
        warm = [leg for leg in legs if leg.concurrency == c and leg.warm]
        acc = Acceptance()
        for leg in warm:
            acc.merge(Acceptance(**{k: v for k, v in leg.acceptance.items()
                                    if k in Acceptance.__dataclass_fields__}))
        rates = [leg.tokens_per_s for leg in warm]
        out[str(c)] = {
            "legs": [leg.index for leg in warm],
            "tokens_per_s_mean": round(sum(rates) / len(rates), 2) if rates else None,
            "tokens_per_s_min": round(min(rates), 2) if rates else None,
            "tokens_per_s_max": round(max(rates), 2) if rates else None,
            "acceptance": acc.as_dict(),
        }
    return out


def run_leg(llm, workload: Workload, concurrency: int, index: int, warmup_legs: int) -> Leg:
    params = workload.params(seed=index, ignore_eos=True)
    start = time.time()
    t0 = time.perf_counter()
    outs = llm.generate(workload.prompt_list(), params, arrival_steps=workload.arrivals())
    seconds = time.perf_counter() - t0
    acc = Acceptance()
    for o in outs:
        acc.add(o.stats, len(o.token_ids))
    completion = sum(len(o.token_ids) for o in outs)
    return Leg(concurrency, index, sum(len(o.prompt_token_ids) for o in outs), completion, start,
               start + seconds, round(seconds, 4), round(completion / seconds, 2), acc.as_dict(),
               is_warm(index, warmup_legs))


def run_bench(make_llm, workload: Workload, concurrencies: list[int], legs: int,
              warmup_legs: int = 1, progress: bool = True) -> list[Leg]:
    from tqdm import tqdm
    results = []
    with tqdm(total=len(concurrencies) * legs, unit="leg", disable=not progress) as bar:
        for c in concurrencies:
            llm = make_llm(c)
            for i in range(legs):
                bar.set_description(f"c={c} leg {i}")
                results.append(run_leg(llm, workload, c, i, warmup_legs))
                bar.update(1)
    return results


def report(legs: list[Leg], workload: Workload, meta: dict) -> dict:
    return {"workload": {"fingerprint": workload.fingerprint(), "num_prompts": workload.num_reqs,
                         "max_tokens": workload.max_tokens_json(), "temperature": workload.temperature},
            **meta, "legs": [asdict(leg) for leg in legs], "summary": fold(legs)}


def plot(legs: list[Leg], path: str | Path, title: str) -> None:
    """τ and tokens/s per leg, one line per concurrency, so a collapse over a run shows."""
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_tau, ax_tps) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for c in sorted({leg.concurrency for leg in legs}):
        mine = [leg for leg in legs if leg.concurrency == c]
        xs = [leg.index for leg in mine]
        ax_tau.plot(xs, [leg.acceptance["mean_acceptance_length"] for leg in mine], "o-", label=f"c={c}")
        ax_tps.plot(xs, [leg.tokens_per_s for leg in mine], "o-", label=f"c={c}")
        for leg in mine:
            if not leg.warm:
                ax_tps.annotate("cold", (leg.index, leg.tokens_per_s), fontsize=7)
    ax_tau.set_ylabel("τ (1 + accepted/drafts)")
    ax_tps.set_ylabel("output tokens/s")
    ax_tps.set_xlabel("leg")
    ax_tps.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax_tau.legend()
    ax_tau.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
