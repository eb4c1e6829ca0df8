"""The bench's folded figures recomputed from scratch, from the per-leg records alone.

`specgate bench` reports every leg and two folds of them (engine/bench/legs.py): `summary` (fold():
per concurrency, tokens/s mean, min and max and the acceptance merged over the warm legs) and
`figures` (what the plot draws and the JSON holds). Both are recomputed here from the report's
`legs` with none of the bench's helpers (not fold, figures, is_warm, nor engine.bench.metrics.Acceptance)
and compared field by field, exactly: the bench rounds, and the recomputation rounds the same
sums the same way.

Generic over fields where the rule is: every integer field of a leg's acceptance is a counter,
summed over the warm legs; every list field is a per-position counter, summed elementwise (the
longer list sets the length); every leg field named in FOLDED_RATES folds as mean, min and max.
A float field of the acceptance is a ratio of the sums and needs its formula in RATIOS. A field
the bench folds or plots that has no recomputation here is a difference too, so a field added to
the legs or the fold is either checked or fails loudly, never skipped.

`same_legs_difference` states the fold's one rule directly: per concurrency, both axes fold over
exactly the warm legs. Each axis's population is read back from its own folded figures (every set
of the concurrency's legs whose tokens/s mean, min and max, or whose folded acceptance, equals the
summary's), so a difference names the legs each axis took, not only a field that came out wrong.
"""
from itertools import combinations

from gates.compare import Difference

# A ratio of the folded sums, as vLLM and SGLang define it (engine/bench/metrics.py's docstring).
RATIOS = {
    "mean_acceptance_length": lambda s: 1 + s["num_accepted_tokens"] / s["num_drafts"] if s["num_drafts"] else 1.0,
    "acceptance_rate": lambda s: s["num_accepted_tokens"] / s["num_draft_tokens"] if s["num_draft_tokens"] else 0.0,
    "accept_length": lambda s: s["completion_tokens"] / s["verify_steps"] if s["verify_steps"] else 0.0,
}
RATIO_DIGITS, RATE_DIGITS = 4, 2
FOLDED_RATES = ("tokens_per_s",)   # leg fields the fold reports as <field>_mean, _min and _max
HOST_PHASES = ("plan", "upload", "launch", "completion")  # engine/bench/metrics.py PHASES; the waiting part apart


class NoRecomputation(Exception):
    """A field the bench folds for which this module has no rule."""


def fold_records(records: list[dict], fields: dict[str, type]) -> dict:
    """Acceptance records (dicts) folded into one; `fields` maps every field of the population
    (its cold legs too, so a population without a warm leg still names them all) to its type."""
    out, sums = {}, {}
    for name, kind in fields.items():
        values = [r[name] for r in records if name in r]
        if kind is int:
            sums[name] = out[name] = sum(values)
        elif kind is list:
            width = max((len(v) for v in values), default=0)
            out[name] = [sum(v[j] for v in values if j < len(v)) for j in range(width)]
        elif name in RATIOS:
            out[name] = None  # from the sums, below
        else:
            raise NoRecomputation(f"acceptance field {name!r} ({kind.__name__}) has no recomputation: "
                                  f"add its formula to gates/bench_fold.py RATIOS")
    zero = dict.fromkeys(("num_accepted_tokens", "num_drafts", "num_draft_tokens", "completion_tokens",
                          "verify_steps"), 0)
    for name in out:
        if out[name] is None:
            out[name] = round(RATIOS[name]({**zero, **sums}), RATIO_DIGITS)
    return out


def _fields(legs: list[dict]) -> dict[str, type]:
    kinds = {}
    for leg in legs:
        kinds |= {k: type(v) for k, v in leg["acceptance"].items() if k not in kinds}
    return kinds


def expected_summary(legs: list[dict]) -> dict:
    """fold() recomputed: per concurrency (ascending, as strings), its warm legs' indices, each
    FOLDED_RATES field's mean/min/max (None without a warm leg) and the folded acceptance."""
    out = {}
    for c in sorted({leg["concurrency"] for leg in legs}):
        mine = [leg for leg in legs if leg["concurrency"] == c]
        warm = [leg for leg in mine if leg["warm"]]
        entry = {"legs": [leg["index"] for leg in warm]}
        for name in FOLDED_RATES:
            entry |= rate_fold(name, [leg[name] for leg in warm])
        entry["acceptance"] = fold_records([leg["acceptance"] for leg in warm], _fields(mine))
        entry["phases"] = expected_phases([leg["phases"] for leg in warm if leg.get("phases")])
        out[str(c)] = entry
    return out


def rate_fold(name: str, values: list[float]) -> dict:
    """A FOLDED_RATES field's mean, min and max over some legs' values (None over no leg)."""
    return {f"{name}_mean": round(sum(values) / len(values), RATE_DIGITS) if values else None,
            f"{name}_min": round(min(values), RATE_DIGITS) if values else None,
            f"{name}_max": round(max(values), RATE_DIGITS) if values else None}


def folded_legs(report: dict, concurrency: str) -> dict[str, list[list[int]]]:
    """The legs each axis of one concurrency's fold took, read back from its figures alone:
    `throughput`, every set of the concurrency's legs (as index lists, in leg order) whose
    FOLDED_RATES fields fold to the summary's; `acceptance`, every set whose acceptance records
    fold to the summary's acceptance. Legs with equal figures (greedy legs run the same tokens)
    make several sets fit; a correct fold's warm legs are always among them."""
    mine = [leg for leg in report["legs"] if str(leg["concurrency"]) == concurrency]
    summary, fields = report["summary"][concurrency], _fields(mine)
    subsets = [list(chosen) for n in range(len(mine) + 1) for chosen in combinations(mine, n)]
    fit = {
        "throughput": lambda legs: all(summary[field] == value for name in FOLDED_RATES
                                       for field, value in rate_fold(name, [leg[name] for leg in legs]).items()),
        "acceptance": lambda legs: fold_records([leg["acceptance"] for leg in legs], fields) == summary["acceptance"],
    }
    return {axis: [[leg["index"] for leg in legs] for legs in subsets if fits(legs)] for axis, fits in fit.items()}


def same_legs_difference(report: dict) -> Difference | None:
    """Both axes fold over exactly the warm legs, per concurrency: the summary names the legs whose
    own `warm` flag is set, and those legs are a set each axis's folded figures fit
    (folded_legs). The first concurrency where either fails, or None."""
    for c in sorted({str(leg["concurrency"]) for leg in report["legs"]}, key=int):
        warm = [leg["index"] for leg in report["legs"] if str(leg["concurrency"]) == c and leg["warm"]]
        named = report["summary"][c]["legs"]
        if named != warm:
            return Difference(f"legs the fold names at concurrency {c} (summary.legs)", None, None, None, warm, named)
        try:
            populations = folded_legs(report, c)
        except NoRecomputation as e:
            return Difference(str(e), None, None, None, "a recomputation", "none")
        for axis, fitting in populations.items():
            if warm not in fitting:
                return Difference(f"legs the {axis} axis folded at concurrency {c}", None, None, None, warm,
                                  fitting or "no set of legs")
    return None


def expected_phases(records: list[dict]) -> dict:
    """The warm legs' phase clocks folded: each phase's summed seconds over the summed steps, in
    ms per step; GPU ms per step over the steps that had a GPU span, and over those replayed as a
    CUDA graph; host total over GPU."""
    steps = sum(r["steps"] for r in records)
    gpu_steps = sum(r["gpu_steps"] for r in records)
    graph_steps = sum(r["graph_steps"] for r in records)
    seconds = {name: sum(r["host_seconds"][name] for r in records) for name in (*HOST_PHASES, "completion_wait")}
    host_ms = sum(seconds[name] for name in HOST_PHASES) * 1e3 / steps if steps else None
    gpu_ms = sum(r["gpu_ms"] for r in records) / gpu_steps if gpu_steps else None
    return {"steps": steps, "clock": records[0]["clock"] if records else None,
            "host_ms_per_step": {name: round(1e3 * t / steps, 4) if steps else None for name, t in seconds.items()}
            | {"total": round(host_ms, 4) if host_ms is not None else None},
            "gpu_ms_per_step": round(gpu_ms, 4) if gpu_ms is not None else None,
            "graph_gpu_ms_per_step": round(sum(r["graph_gpu_ms"] for r in records) / graph_steps, 4)
            if graph_steps else None,
            "host_over_gpu": round(host_ms / gpu_ms, 3) if host_ms is not None and gpu_ms else None}


def expected_figures(legs: list[dict], spec: bool) -> dict:
    """figures() recomputed: per concurrency, every leg's index, warm flag and tokens/s, the fold
    of the warm legs; with a drafter also each leg's τ, the folded τ and the acceptance rate per
    draft position over the warm legs (accepted at position j / drafts)."""
    summary = expected_summary(legs)
    out = {}
    for c, folded in summary.items():
        mine = [leg for leg in legs if str(leg["concurrency"]) == c]
        fig = {"legs": [leg["index"] for leg in mine], "warm": [leg["warm"] for leg in mine],
               "tokens_per_s": [leg["tokens_per_s"] for leg in mine],
               "fold": {"mean": folded["tokens_per_s_mean"], "min": folded["tokens_per_s_min"],
                        "max": folded["tokens_per_s_max"], "warm_legs": folded["legs"]}}
        if spec:
            acc = folded["acceptance"]
            fig["tau"] = [leg["acceptance"]["mean_acceptance_length"] for leg in mine]
            fig["tau_fold"] = acc["mean_acceptance_length"]
            fig["acceptance_per_position"] = [round(n / acc["num_drafts"], RATIO_DIGITS) if acc["num_drafts"] else 0.0
                                              for n in acc["accepted_per_position"]]
        out[c] = fig
    return out


def report_difference(report: dict) -> Difference | None:
    """The first field of the report's `summary` or `figures` that differs from its recomputation
    from the report's `legs` (a missing or unrecomputed field counts), or None."""
    legs = report["legs"]
    try:
        expected = {"summary": expected_summary(legs), "figures": expected_figures(legs, bool(report.get("spec")))}
    except NoRecomputation as e:
        return Difference(str(e), None, None, None, "a recomputation", "none")
    for part, want in expected.items():
        diff = _first_difference(want, report[part], part)
        if diff is not None:
            return diff
    return None


def _first_difference(want, got, path: str) -> Difference | None:
    if isinstance(want, dict) and isinstance(got, dict):
        if list(got) != list(want):
            extra = [k for k in got if k not in want]
            what = (f"{path}: the bench reports {extra}, which have no recomputation (gates/bench_fold.py)"
                    if extra else f"{path}: fields")
            return Difference(what, None, None, None, list(want), list(got))
        for key in want:
            diff = _first_difference(want[key], got[key], f"{path}.{key}")
            if diff is not None:
                return diff
        return None
    if want != got or type(want) is not type(got):
        return Difference(f"folded {path} (recomputed from the legs)", None, None, None, want, got)
    return None
