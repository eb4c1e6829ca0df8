"""`specgate mutate merge DIR ...`: shard reports (and a --cuda-only report) combined into one report,
one score and one ratchet decision, as if one run had tested every mutant.

Each DIR is a `--report` folder of `specgate mutate --shard I/N`, of a full run (one shard of one),
or of `--cuda-only` (its summary.json and records.json). The shards must all come from one listing
of the mutants (the same sources), one suite (the same tests and configuration) and the same N,
each index once; together they then hold every mutant exactly once and the merge is a complete run
(the baseline ratchet applies). A --cuda-only report replaces the CPU verdicts of the mutants it
judged (a run stopped at its time limit leaves some not checked: those keep their CPU verdict),
except a CPU kill, which stands: a CUDA-only mutant killed on the GPU is killed, and its entry
stays, as it explains the CPU runs' survivor; one the CPU suite now kills makes its entry stale.
"""
import json
import time
from pathlib import Path

from mutants.mutation.ratchet import baseline_record, load_baseline, ratchet, stale_equivalents, update_baseline
from mutants.mutation.record import MutantRecord
from mutants.mutation.report import score_line, summarise, write_reports
from mutants.mutation.results import load_equivalents
from mutants.mutation.stage import REPO


def read_report(folder: Path) -> tuple[dict, list[MutantRecord]]:
    summary_path, records_path = folder / "summary.json", folder / "records.json"
    if not (summary_path.is_file() and records_path.is_file()):
        raise ValueError(f"{folder}: not a mutation report folder (needs summary.json and records.json)")
    summary = json.loads(summary_path.read_text())
    records = [MutantRecord(**{**r, "covered_by": tuple(r.get("covered_by", ()))})
               for r in json.loads(records_path.read_text())]
    return summary, records


def combine(reports: list[tuple[dict, list[MutantRecord]]]) -> tuple[list[MutantRecord], dict]:
    """The merged records and what the merge was (shards, completeness); raises ValueError when
    the shards do not fit together."""
    shards = [(s, r) for s, r in reports if s.get("mode") == "shard"]
    shards += [({**s, "shard": "1/1"}, r) for s, r in reports if s.get("mode") == "run" and s.get("complete")]
    cuda = [(s, r) for s, r in reports if s.get("mode") == "cuda-only"]
    others = [s.get("mode") for s, _ in reports
              if s.get("mode") not in ("shard", "cuda-only") and not (s.get("mode") == "run" and s.get("complete"))]
    if others:
        raise ValueError(f"merge takes --shard, --cuda-only and complete full-run reports, not a {others[0]!r} "
                         f"run that is incomplete or of another mode")
    if not shards:
        raise ValueError("no shard report to merge")
    counts = {int(s["shard"].split("/")[1]) for s, _ in shards}
    digests = {s["listing_digest"] for s, _ in shards}
    if len(counts) != 1 or len(digests) != 1:
        raise ValueError("the shards come from different runs: their N or their list of mutants differ "
                         f"(N {sorted(counts)}, listings {sorted(digests)})")
    suites = {s.get("suite_digest") for s, _ in shards}
    if len(suites) != 1:
        raise ValueError("the shards ran different suites (a test or the configuration changed between them), "
                         f"so their verdicts are not one run's: suites {sorted(map(str, suites))}")
    count = counts.pop()
    indices = sorted(int(s["shard"].split("/")[0]) for s, _ in shards)
    if len(indices) != len(set(indices)):
        raise ValueError(f"a shard is given twice: {indices}")
    by_name: dict[str, MutantRecord] = {}
    for _, records in shards:
        for r in records:
            if r.name in by_name:
                raise ValueError(f"{r.name} is in two shards")
            by_name[r.name] = r
    in_scope = shards[0][0]["mutants_in_scope"]
    complete = indices == list(range(1, count + 1)) and len(by_name) == in_scope
    replaced, killed_on_cuda = 0, []
    for _, records in cuda:
        for r in records:
            # a kill by either suite is a kill: a CUDA survivor never revives a CPU kill
            if r.name in by_name and r.status != "not checked" and by_name[r.name].status != "killed":
                by_name[r.name] = r
                replaced += 1
                if r.status == "killed":
                    killed_on_cuda.append(r.name)
    meta = {"shards": f"{len(indices)} of {count}", "complete": complete, "mutants_in_scope": in_scope,
            "cuda_verdicts": replaced, "killed_on_cuda": sorted(killed_on_cuda), "commit": shards[0][0].get("commit"),
            "wall_s_per_shard": [s.get("wall_s") for s, _ in shards]}
    return sorted(by_name.values(), key=lambda r: r.name), meta


def merge(folders: list[Path], report_dir: Path, raise_baseline: bool = False) -> int:
    t0 = time.perf_counter()
    reports = [read_report(f) for f in folders]
    records, meta = combine(reports)
    equivalents = load_equivalents()
    complete = meta["complete"]
    summary = summarise(records)
    stale = stale_equivalents(records, equivalents, complete, frozenset(meta["killed_on_cuda"]))
    problems = ratchet(summary, load_baseline(), complete, stale, rescoping=raise_baseline)
    if not complete:
        problems.append(f"incomplete merge: {meta['shards']} shards, {len(records)} of "
                        f"{meta['mutants_in_scope']} mutants")
    sources = {p: (REPO / p).read_text() for p in sorted({r.path for r in records}) if (REPO / p).is_file()}
    extra = {"command": "specgate mutate merge " + " ".join(str(f) for f in folders), "mode": "merge", **meta,
             "wall_s": round(time.perf_counter() - t0, 1), "baseline": baseline_record(),
             "stale_equivalents": stale, "problems": problems}
    write_reports(report_dir, records, sources, extra)
    print(f"mutate merge: {meta['shards']} shards, {len(records)} mutants"
          f"{', ' + str(meta['cuda_verdicts']) + ' verdicts from the CUDA run' if meta['cuda_verdicts'] else ''}; "
          f"reports in {report_dir}")
    for p in problems:
        print(f"mutate: FAIL: {p}")
    if raise_baseline and not problems:
        print(update_baseline(summary, meta["commit"]))
    print(score_line(summary))
    return 1 if problems else 0
