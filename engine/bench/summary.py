"""The 1B benchmark's summary: the decode, peer, load and spec reports joined into one JSON, the
ratios issue 36's targets are stated in, a short table, and a PNG.

Targets, on the default CUDA path (the compiled forward, async graph arm, every attention backend):
ms per step over the HBM floor at most 1.9x at c=1 and 2.1x at c=8 (0.90 and 1.00 ms on the H200);
the transformers peer's ms per step over the arm's at least 2.3x and the gpt-fast-style dense
peer's at least 1.15x. On the spec bench (c=1): tokens/s at τ about 4.3 at least 3.3x plain's, its
verify step's GPU time at most 1.2x a plain step's, and each leg's host time (plan, upload, launch
and completion's own work; its wait for the GPU apart) at most 0.7x its GPU time.
"""
import json
from pathlib import Path

TARGETS = {"floor_ratio": {"1": 1.9, "8": 2.1}, "peer_speedup": 2.3, "dense_speedup": 1.15, "spec_speedup": 3.3,
           "verify_cost": 1.2, "host_over_gpu": 0.7}


def is_target_arm(arm: str) -> bool:
    """The default CUDA path: the async graph arm of the compiled forward, with any attention backend."""
    return arm.startswith("graph/async/") and arm.endswith("/compiled")


def _read(path) -> dict | None:
    return json.loads(Path(path).read_text()) if path and Path(path).is_file() else None


def summarize(decode: dict | None, peer: dict | None = None, load: dict | None = None,
              spec: dict[str, dict] | None = None) -> dict:
    """`spec`: label -> a `specgate bench --json` report; the label "plain" is the baseline."""
    out: dict = {"decode": decode, "peer": peer, "load": load, "spec": spec or {}, "rows": {}}
    rows = out["rows"]
    if decode:
        for c, f in decode["floor"].items():
            rows.setdefault(c, {})["floor_ms"] = f["ms"]
            for arm, per_c in decode["arms"].items():
                if c in per_c:
                    ms = per_c[c]["ms_per_step"]
                    rows[c][arm] = {"ms_per_step": ms, "floor_ratio": round(ms / f["ms"], 3),
                                    "tokens_per_s": per_c[c]["tokens_per_s"]}
    for report, name, ratio in ((peer, "transformers", "peer_speedup"),
                                (peer and peer.get("dense"), "dense", "dense_speedup")):
        if report and report.get("ran"):
            for c, p in report["per_concurrency"].items():
                row = rows.setdefault(c, {})
                row[f"{name}_ms_per_step"] = p["ms_per_step"]
                for r in list(row.values()):
                    if isinstance(r, dict) and "ms_per_step" in r:
                        r[ratio] = round(p["ms_per_step"] / r["ms_per_step"], 3)
    out["spec_rows"] = _spec_rows(spec or {})
    out["targets"] = targets(out)
    return out


def _spec_rows(spec: dict[str, dict]) -> list[dict]:
    plain = spec.get("plain", {}).get("summary", {})
    rows = []
    for label, report in spec.items():
        for c, s in report.get("summary", {}).items():
            base = plain.get(c, {}).get("tokens_per_s_mean")
            rate = s["tokens_per_s_mean"]
            # No warm leg: the fold merged no legs, and an empty fold's acceptance length (1.0) is
            # no measurement.
            measured = report.get("spec") and rate is not None
            rows.append({"label": label, "concurrency": c, "tokens_per_s": rate,
                         "tau": s["acceptance"].get("mean_acceptance_length") if measured else None,
                         "vs_plain": round(rate / base, 3) if base and rate else None,
                         "gpu_ms_per_step": (s.get("phases") or {}).get("gpu_ms_per_step"),
                         "graph_gpu_ms_per_step": (s.get("phases") or {}).get("graph_gpu_ms_per_step"),
                         "host_over_gpu": host_over_gpu(s.get("phases"))})
    return rows


def host_over_gpu(phases: dict | None) -> float | None:
    """The host's own time per step over the GPU's: plan, upload, launch and completion less its
    wait for the GPU (a host that waits is not busy; `StepPhases` counts that wait apart)."""
    if not phases or not phases.get("gpu_ms_per_step"):
        return None
    h = phases["host_ms_per_step"]
    own = h["plan"] + h["upload"] + h["launch"] + h["completion"] - h["completion_wait"]
    return round(own / phases["gpu_ms_per_step"], 3)


def targets(summary: dict) -> list[dict]:
    """Each target of issue 36 this run measured: the figure, the bound, met or not."""
    found = []
    for c, bound in TARGETS["floor_ratio"].items():
        row = summary["rows"].get(c, {})
        for arm in sorted(a for a in row if is_target_arm(a)):  # every backend
            r = row[arm]
            found.append({"target": f"{arm} c={c} at most {bound}x the HBM floor",
                          "figure": r["floor_ratio"], "met": r["floor_ratio"] <= bound})
            for ratio, peer in (("peer_speedup", "transformers"), ("dense_speedup", "the gpt-fast-style peer")):
                if ratio in r:
                    found.append({"target": f"{arm} c={c} at least {TARGETS[ratio]}x faster than {peer}",
                                  "figure": r[ratio], "met": r[ratio] >= TARGETS[ratio]})
    # A verify step against a plain one: GPU time of the steps replayed as a graph alone. A mean
    # over every step would count the eager prefills, several times a replay's cost, once per
    # prompt: over a spec leg's fewer steps they weigh more.
    plain_gpu = {r["concurrency"]: r["graph_gpu_ms_per_step"] for r in summary["spec_rows"] if r["label"] == "plain"}
    for row in summary["spec_rows"]:
        name = f"spec {row['label']}" + (f" (τ {row['tau']:.2f})" if row["tau"] is not None else "")
        if row["label"] != "plain" and row["tau"] is not None and row["tau"] >= 4.0 and row["concurrency"] == "1":
            if row["vs_plain"] is not None:
                found.append({"target": f"{name} c=1 at least {TARGETS['spec_speedup']}x plain tokens/s",
                              "figure": row["vs_plain"], "met": row["vs_plain"] >= TARGETS["spec_speedup"]})
            if row["graph_gpu_ms_per_step"] and plain_gpu.get("1"):
                cost = round(row["graph_gpu_ms_per_step"] / plain_gpu["1"], 3)
                found.append({"target": f"{name} c=1 verify step at most {TARGETS['verify_cost']}x a plain "
                                        "step's GPU time (graph replays)", "figure": cost,
                              "met": cost <= TARGETS["verify_cost"]})
        if row["host_over_gpu"] is not None:
            found.append({"target": f"{name} c={row['concurrency']} host time at most {TARGETS['host_over_gpu']}x "
                                    "the GPU's", "figure": row["host_over_gpu"],
                          "met": row["host_over_gpu"] <= TARGETS["host_over_gpu"]})
    return found


def table(summary: dict) -> str:
    """The short table the GPU script prints last."""
    lines = []
    decode, load, peer = summary["decode"], summary["load"], summary["peer"]
    if decode:
        lines.append(f"bandwidth {decode['bandwidth_bytes_per_s'] / 1e12:.3f} TB/s (copy, read + write), "
                     f"{decode['dtype']}, prompts {decode['workload']['prompt_len']} "
                     f"+ {decode['workload']['max_tokens']} "
                     f"tokens, {decode['gpu'] or decode['device']}, torch {decode['torch']}")
    cs = sorted(summary["rows"], key=int)
    if cs:
        lines.append(f"{'ms per plain decode step':<28}" + "".join(f"{'c=' + c:>22}" for c in cs))
        lines.append(f"{'HBM floor':<28}" + "".join(f"{summary['rows'][c].get('floor_ms', float('nan')):>22.3f}"
                                                    for c in cs))
        arms = sorted({a for c in cs for a, r in summary["rows"][c].items() if isinstance(r, dict)})
        for arm in arms:
            cells = []
            for c in cs:
                r = summary["rows"][c].get(arm)
                cells.append(f"{r['ms_per_step']:.3f} ({r['floor_ratio']:.2f}x floor)" if r else "-")
            lines.append(f"{arm:<28}" + "".join(f"{cell:>22}" for cell in cells))
        for report, name, label in ((peer, "transformers", "transformers static+compile"),
                                    (peer and peer.get("dense"), "dense", "gpt-fast-style dense")):
            if report and report.get("ran"):
                cells = []
                for c in cs:
                    ms = summary["rows"][c].get(f"{name}_ms_per_step")
                    best = min((r["ms_per_step"] for r in summary["rows"][c].values() if isinstance(r, dict)),
                               default=None)
                    cells.append(f"{ms:.3f} ({ms / best:.2f}x best)" if ms and best else "-")
                lines.append(f"{label:<28}" + "".join(f"{cell:>22}" for cell in cells))
    if peer and peer.get("ran") and not all(p.get("compiled") for p in peer["per_concurrency"].values()):
        lines.append(f"transformers peer: transformers {peer.get('transformers')} did NOT compile its forward")
    if peer and not peer.get("ran"):
        lines.append(f"transformers peer: not run ({peer['why']})")
    if peer and peer.get("dense") and not peer["dense"].get("ran"):
        lines.append(f"dense peer: not run ({peer['dense']['why']})")
    if load:
        lines.append(f"load {load['seconds']} s on {load.get('device', '?')}, "
                     f"peak host memory {load['peak_rss_mib']:.0f} MiB "
                     f"({load['load_added_mib']:.0f} MiB over the {load['peak_rss_mib_before']:.0f} MiB baseline; "
                     f"largest of {load['num_shards']} shards {load['largest_shard_mib']:.1f} MiB, "
                     f"{load['files_mib']:.1f} MiB in all)")
    for row in summary["spec_rows"]:
        tau = f" τ {row['tau']:.2f}" if row["tau"] is not None else ""
        vs = f", {row['vs_plain']:.2f}x plain" if row["vs_plain"] is not None and row["label"] != "plain" else ""
        rate = "no warm leg" if row["tokens_per_s"] is None else f"{row['tokens_per_s']} tokens/s"
        lines.append(f"bench {row['label']} c={row['concurrency']}: {rate}{tau}{vs}")
    for t in summary["targets"]:
        lines.append(f"target {'MET   ' if t['met'] else 'MISSED'} {t['target']}: {t['figure']}")
    return "\n".join(lines)


def plot(summary: dict, path) -> None:
    """ms per step per arm and concurrency against the floor and the peer; spec tokens/s per leg
    label with τ."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    spec = summary["spec_rows"]
    fig, axes = plt.subplots(1, 2 if spec else 1, figsize=(13 if spec else 7, 4.5), squeeze=False)
    ax = axes[0][0]
    cs = sorted(summary["rows"], key=int)
    series = sorted({a for c in cs for a, r in summary["rows"][c].items() if isinstance(r, dict)})
    series += ["transformers"] if any("transformers_ms_per_step" in summary["rows"][c] for c in cs) else []
    width = 0.8 / max(1, len(series))
    for n, name in enumerate(series):
        ys = [(summary["rows"][c].get("transformers_ms_per_step") if name == "transformers"
               else (summary["rows"][c].get(name) or {}).get("ms_per_step")) or 0 for c in cs]
        bars = ax.bar([i + (n - (len(series) - 1) / 2) * width for i in range(len(cs))], ys, width * 0.95, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    floors = [(i, summary["rows"][c]["floor_ms"]) for i, c in enumerate(cs) if "floor_ms" in summary["rows"][c]]
    for n, (i, floor) in enumerate(floors):  # one legend entry, on the first floor drawn
        ax.hlines(floor, i - 0.45, i + 0.45, colors="k", linestyles="--", label="HBM floor" if n == 0 else None)
    ax.set_xticks(range(len(cs)), [f"c={c}" for c in cs])
    ax.set_ylabel("ms per plain decode step")
    ax.set_title("plain greedy decode")
    ax.legend(fontsize=8)
    if spec:
        ax = axes[0][1]
        labels = [f"{r['label']}\nc={r['concurrency']}" for r in spec]
        # A concurrency without a warm leg has no rate: a bar of nothing, labelled so.
        bars = ax.bar(range(len(spec)), [r["tokens_per_s"] or 0 for r in spec])
        ax.bar_label(bars, labels=[("no warm leg" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.0f}")
                                   + (f"\nτ {r['tau']:.2f}" if r["tau"] else "") for r in spec], fontsize=7)
        ax.set_xticks(range(len(spec)), labels, fontsize=8)
        ax.set_ylabel("output tokens/s (warm legs)")
        ax.set_title("spec vs plain (specgate bench)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summarize_files(decode=None, peer=None, load=None, spec: dict[str, str] | None = None) -> dict:
    """`summarize` on report files; missing files (a stage that failed) are left out."""
    load_json = _read(load)
    return summarize(_read(decode), _read(peer),
                     {**load_json["load"], "device": load_json["device"]} if load_json else None,
                     {label: r for label, path in (spec or {}).items() if (r := _read(path)) is not None})
