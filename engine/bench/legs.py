"""`specgate bench`: throughput and acceptance per leg, on prompts from held-out stdlib files.

A leg is one pass of the whole workload at one concurrency (max_num_seqs). Every leg records
both axes, throughput and acceptance, and ONE warm-leg predicate decides which legs count for
both, so the two axes always fold over the same population of legs.
"""
import hashlib
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from engine.bench.metrics import PHASES, Acceptance, StepPhases
from engine.bench.oracle import OracleScript
from engine.bench.workload import Workload
from engine.clock import NullClock


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
    spec: str | None = None      # the engine's drafter (the oracle bench runs a plain pass first)
    tokens_sha: str = ""         # sha256 of every request's output ids: the oracle leg's must be the plain's
    phases: dict | None = None   # host time per step by phase, GPU time per step (metrics.StepPhases)


def heldout_workload(corpus, num_prompts: int, prompt_chars: int = 160, *, max_tokens: int,
                     temperature: float = 0.0) -> Workload:
    """Prompts cut at a line start inside the corpus's held-out files (never trained on); `corpus`:
    fixtures.corpus.load_corpus(), handed in by the caller."""
    prompts = []
    for rel in corpus.heldout_files:
        text = corpus.read(rel).decode("utf-8", errors="replace")
        start = text.find("\ndef ") + 1  # no def: -1 + 1, the file's start
        snippet = text[start:start + prompt_chars]
        if len(snippet) >= prompt_chars // 2:
            prompts.append(snippet)
        if len(prompts) == num_prompts:
            break
    return Workload.uniform(prompts, max_tokens, temperature)


def oracle_script(llm, workload: Workload, k: int, tau: float) -> OracleScript:
    """What the oracle replays: a plain greedy run of the workload on `llm` (a plain engine on the
    target), each request given k more tokens than the workload asks, so that the drafts of its
    last verify step are known too."""
    params = [replace(p, max_tokens=p.max_tokens + k) for p in workload.params(ignore_eos=True)]
    outs = llm.generate(workload.prompt_list(), params, arrival_steps=workload.arrivals())
    return OracleScript.from_outputs(outs, tau, llm.config.model)


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
            "phases": fold_phases([leg.phases for leg in warm if leg.phases]),
        }
    return out


def fold_phases(phases: list[dict]) -> dict:
    """Host ms per step by phase and GPU ms per step over legs, of every step and of the steps
    replayed as a CUDA graph: their summed times over their summed steps (a leg with more steps
    weighs more, as its steps do)."""
    steps = sum(p["steps"] for p in phases)
    gpu_steps = sum(p["gpu_steps"] for p in phases)
    graph_steps = sum(p["graph_steps"] for p in phases)
    host = {name: sum(p["host_seconds"][name] for p in phases) for name in (*PHASES, "completion_wait")}
    per_step = {name: round(1e3 * t / steps, 4) if steps else None for name, t in host.items()}
    total = sum(host[name] for name in PHASES)
    gpu = round(sum(p["gpu_ms"] for p in phases) / gpu_steps, 4) if gpu_steps else None
    graph = round(sum(p["graph_gpu_ms"] for p in phases) / graph_steps, 4) if graph_steps else None
    return {"steps": steps, "clock": phases[0]["clock"] if phases else None,
            "host_ms_per_step": per_step | {"total": round(1e3 * total / steps, 4) if steps else None},
            "gpu_ms_per_step": gpu, "graph_gpu_ms_per_step": graph,
            "host_over_gpu": round(1e3 * total / steps / gpu, 3) if gpu and steps else None}


def run_leg(llm, workload: Workload, concurrency: int, index: int, warmup_legs: int) -> Leg:
    params = workload.params(seed=index, ignore_eos=True)
    llm.clock = StepPhases(cuda=llm.runner.is_cuda)
    start = time.time()
    t0 = time.perf_counter()
    outs = llm.generate(workload.prompt_list(), params, arrival_steps=workload.arrivals())
    seconds = time.perf_counter() - t0
    phases, llm.clock = llm.clock.as_dict(), NullClock()
    acc = Acceptance()
    for o in outs:
        acc.add(o.stats, len(o.token_ids))
    completion = sum(len(o.token_ids) for o in outs)
    return Leg(concurrency, index, sum(len(o.prompt_token_ids) for o in outs), completion, start,
               start + seconds, round(seconds, 4), round(completion / seconds, 2), acc.as_dict(),
               is_warm(index, warmup_legs), llm.config.spec,
               tokens_sha(outs), phases)


def tokens_sha(outs) -> str:
    """sha256 of every request's output ids, in request order, 16 hex digits."""
    return hashlib.sha256(repr([list(o.token_ids) for o in outs]).encode()).hexdigest()[:16]


def run_bench(make_llm, workload: Workload, concurrencies: list[int], legs: int, warmup_legs: int,
              progress: bool, on_leg=None) -> list[Leg]:
    """Every leg of every concurrency; a progress bar when `progress`, and `on_leg(leg)` after each
    (the command prints a line per leg when it is not on a terminal)."""
    from tqdm import tqdm
    results = []
    with tqdm(total=len(concurrencies) * legs, unit="leg", disable=not progress) as bar:
        for c in concurrencies:
            results += _legs(make_llm(c), workload, c, legs, warmup_legs, bar, on_leg)
    return results


def _legs(llm, workload: Workload, c: int, legs: int, warmup_legs: int, bar, on_leg, name: str = "") -> list[Leg]:
    results = []
    for i in range(legs):
        bar.set_description(f"{name}c={c} leg {i}")
        results.append(run_leg(llm, workload, c, i, warmup_legs))
        bar.update(1)
        if on_leg is not None:
            on_leg(results[-1])
    return results


def run_oracle_bench(make_llm, workload: Workload, concurrencies: list[int], legs: int, warmup_legs: int,
                     tau: float, k: int, progress: bool, on_leg=None) -> tuple[list[Leg], list[Leg]]:
    """Per concurrency: the plain legs, the plain run the oracle replays (oracle_script), then the
    oracle legs at `tau`. `make_llm(c, script)`: a plain engine when script is None, else an
    oracle one. Returns (plain legs, oracle legs)."""
    from tqdm import tqdm
    plain, oracle = [], []
    with tqdm(total=2 * len(concurrencies) * legs, unit="leg", disable=not progress) as bar:
        for c in concurrencies:
            llm = make_llm(c, None)
            plain += _legs(llm, workload, c, legs, warmup_legs, bar, on_leg, "plain ")
            script = oracle_script(llm, workload, k, tau)
            del llm
            oracle += _legs(make_llm(c, script), workload, c, legs, warmup_legs, bar, on_leg, "oracle ")
    return plain, oracle


def oracle_report(plain: list[Leg], oracle: list[Leg], workload: Workload, meta: dict) -> dict:
    """The oracle legs' report, with the plain pass beside it: its legs and fold, and per
    concurrency the speed-up (oracle over plain tokens/s, warm means) and whether every oracle
    leg emitted the plain legs' tokens (lossless)."""
    out = report(oracle, workload, meta)
    plain_summary = fold(plain)
    compare = {}
    for c, s in out["summary"].items():
        base = plain_summary[c]["tokens_per_s_mean"]
        shas = {leg.tokens_sha for leg in plain + oracle if str(leg.concurrency) == c}
        compare[c] = {"speedup": round(s["tokens_per_s_mean"] / base, 3) if base and s["tokens_per_s_mean"] else None,
                      "tau": s["acceptance"]["mean_acceptance_length"], "lossless": len(shas) == 1}
    return out | {"plain": {"legs": [asdict(leg) for leg in plain], "summary": plain_summary},
                  "oracle_vs_plain": compare}


def report(legs: list[Leg], workload: Workload, meta: dict) -> dict:
    spec = bool(meta.get("spec"))
    return {"workload": {"fingerprint": workload.fingerprint(), "num_prompts": workload.num_reqs,
                         "max_tokens": workload.max_tokens_json(), "temperature": workload.temperature},
            **meta, "legs": [asdict(leg) for leg in legs], "summary": fold(legs),
            "figures": figures(legs, spec)}


def figures(legs: list[Leg], spec: bool) -> dict:
    """What the plot draws, per concurrency: tokens/s and warm flag per leg and the fold (mean,
    min, max over the warm legs); with a drafter also τ per leg and the acceptance rate per draft
    position over the warm legs (accepted at position j / drafts). The JSON holds the same dict."""
    summary = fold(legs)
    out = {}
    for c, s in summary.items():
        mine = [leg for leg in legs if str(leg.concurrency) == c]
        fig = {"legs": [leg.index for leg in mine], "warm": [leg.warm for leg in mine],
               "tokens_per_s": [leg.tokens_per_s for leg in mine],
               "fold": {k: s[f"tokens_per_s_{k}"] for k in ("mean", "min", "max")} | {"warm_legs": s["legs"]}}
        if spec:
            acc = s["acceptance"]
            fig["tau"] = [leg.acceptance["mean_acceptance_length"] for leg in mine]
            fig["tau_fold"] = acc["mean_acceptance_length"]
            fig["acceptance_per_position"] = [round(n / acc["num_drafts"], 4) if acc["num_drafts"] else 0.0
                                              for n in acc["accepted_per_position"]]
        out[c] = fig
    return out


def plot(figs: dict, path: str | Path, title: str) -> None:
    """One PNG of a run, from `figures()`: tokens/s per leg (warm-up legs hollow, the fold of the
    warm legs as a line and band); with a drafter also τ per leg and acceptance per draft position
    as grouped bars. Concurrencies are side by side (offsets, own colour and marker), never on top."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    spec = any("tau" in f for f in figs.values())
    cs = list(figs)
    fig, axes = plt.subplots(1, 3 if spec else 1, figsize=(15 if spec else 7.5, 5), squeeze=False)
    axes = axes[0]
    colours, markers = plt.rcParams["axes.prop_cycle"].by_key()["color"], "osD^v<>p"
    width = 0.8 / len(cs)
    ax = axes[0]
    for n, c in enumerate(cs):
        f, colour, marker = figs[c], colours[n % len(colours)], markers[n % len(markers)]
        xs = [i + (n - (len(cs) - 1) / 2) * width for i in f["legs"]]
        ax.plot(xs, f["tokens_per_s"], "-", color=colour, alpha=0.4)
        for x, y, warm in zip(xs, f["tokens_per_s"], f["warm"]):
            ax.plot([x], [y], marker, color=colour, markersize=8, markerfacecolor=colour if warm else "white")
        fold = f["fold"]
        if fold["mean"] is not None:
            lo, hi = min(f["legs"]) - 0.45, max(f["legs"]) + 0.45
            warm_x = [x for x, w in zip(xs, f["warm"]) if w]
            ax.fill_between([min(warm_x) - width / 2, max(warm_x) + width / 2], fold["min"], fold["max"],
                            color=colour, alpha=0.12)
            ax.hlines(fold["mean"], lo, hi, colors=colour, linestyles="--", linewidth=1.2)
            ax.annotate(f"c={c}: {fold['mean']:.0f} tok/s\n(mean of warm legs {fold['warm_legs']})",
                        (hi, fold["mean"]), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=8, color=colour)
        ax.plot([], [], marker + "-", color=colour, label=f"c={c}")
    ax.plot([], [], "o", color="grey", markerfacecolor="white", label="warm-up leg (not averaged)")
    ax.plot([], [], "o", color="grey", label="warm leg")
    ax.plot([], [], "--", color="grey", label="mean of warm legs (band: min-max)")
    ax.set_ylabel("output tokens/s")
    ax.set_xlabel("leg")
    all_legs = sorted({i for f in figs.values() for i in f["legs"]})
    ax.set_ylim(0, 1.15 * max(max(f["tokens_per_s"]) for f in figs.values()))
    ax.set_xlim(all_legs[0] - 0.6, all_legs[-1] + 1.9)  # room on the right for the fold's labels
    ax.set_xticks(all_legs)
    ax.set_title("throughput per leg")
    ax.legend(fontsize=8, loc="lower left")
    if spec:
        _bars(axes[1], figs, "tau", "legs", width, colours, "τ per leg (1 + accepted / drafts)", "leg")
        axes[1].set_ylim(1, 1 + 1.25 * (max(max(f["tau"]) for f in figs.values()) - 1) + 0.05)
        _bars(axes[2], figs, "acceptance_per_position", None, width, colours,
              "acceptance per draft position (warm legs)", "draft position")
        axes[2].set_ylim(0, 1.15)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _bars(ax, figs: dict, key: str, xkey: str | None, width: float, colours, title: str, xlabel: str) -> None:
    """Grouped bars, one group per x, one bar per concurrency, each labelled with its value;
    warm-up legs are hatched."""
    import matplotlib.ticker
    for n, (c, f) in enumerate(figs.items()):
        ys = f[key]
        xs = f[xkey] if xkey else list(range(1, len(ys) + 1))
        offs = [x + (n - (len(figs) - 1) / 2) * width for x in xs]
        hatches = ["//" if xkey and not w else "" for w in (f["warm"] if xkey else ys)]
        bars = ax.bar(offs, ys, width * 0.95, color=colours[n % len(colours)], label=f"c={c}", edgecolor="white")
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend(fontsize=8, loc="upper right", ncol=len(figs), title="hatched: warm-up leg" if xkey else None,
              title_fontsize=7)
