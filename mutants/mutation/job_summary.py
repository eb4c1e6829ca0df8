"""The mutation run's summary where a reviewer looks: one Markdown page (job-summary.md, which the
CI merge job appends to the job summary, $GITHUB_STEP_SUMMARY) and the same figures as an HTML
block at the top of the offline report page. Every run writes it (a shard, a --since run, a merge):
the score, the test strength against the baseline, the ratchet's decision with each problem, a
table per module, and every survivor nobody has explained.
"""
from collections import Counter
from collections.abc import Iterable
from html import escape

from mutants.mutation.record import RUN_FAILURES, MutantRecord


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def module_rows(records: Iterable[MutantRecord]) -> list[dict]:
    """Per source file: mutants, killed, unexplained survivors, reviewed equivalents, no tests, run
    failures, and its test strength (killed over the mutants some test reaches)."""
    by_path: dict[str, Counter] = {}
    for r in records:
        c = by_path.setdefault(r.path, Counter())
        c["mutants"] += 1
        c["killed"] += r.status == "killed"
        c["unexplained"] += r.status == "survived" and not r.equivalent
        c["equivalent"] += r.status == "survived" and bool(r.equivalent)
        c["no tests"] += r.status in ("no tests", "skipped")
        c["run failures"] += r.status in RUN_FAILURES
    rows = []
    for path, c in sorted(by_path.items()):
        reachable = c["mutants"] - c["no tests"]
        rows.append({"module": path, **{k: c[k] for k in ("mutants", "killed", "unexplained", "equivalent",
                                                          "no tests", "run failures")},
                     "strength": c["killed"] / reachable if reachable else None})
    return rows


def decision(problems: list[str]) -> str:
    return "PASS" if not problems else f"FAIL ({len(problems)} problem{'s' * (len(problems) != 1)})"


def markdown(records: list[MutantRecord], summary: dict, extra: dict) -> str:
    baseline = extra.get("baseline") or {}
    problems = extra.get("problems", [])
    unexplained = [r for r in records if r.status == "survived" and not r.equivalent]
    scope = extra.get("command") or "specgate mutate"
    out = [f"## Mutation testing: {decision(problems)}", "",
           f"`{scope}` at {extra.get('commit') or 'an unknown commit'}"
           + (f", {extra['shards']} shards" if extra.get("shards") else "")
           + ("" if extra.get("complete") else " (not a complete run of the scope)"), "",
           "| figure | value |", "| --- | --- |",
           f"| mutation score | {_pct(summary['mutation_score'])} of {summary['total']} mutants |",
           f"| test strength | {_pct(summary['test_strength'])} ({summary['killed']} killed) |",
           f"| baseline test strength | {_pct(baseline.get('test_strength'))} "
           f"(commit {baseline.get('commit') or 'none'}) |",
           f"| survivors | {summary['survived']} ({summary['survivors_unexplained']} unexplained) |",
           f"| run failures | {summary['run_failures']} |",
           *([f"| sampled | {extra['sampled']} |"] if extra.get("sampled") else []), ""]
    out += ["### The ratchet", ""] + ([f"- {p}" for p in problems] or ["Passed: nothing under the baseline, no "
                                                                       "unexplained survivor, no run failure."]) + [""]
    out += ["### Per module", "", "| module | mutants | killed | unexplained | equivalent | no tests | run failures "
            "| test strength |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    out += [f"| `{m['module']}` | {m['mutants']} | {m['killed']} | {m['unexplained']} | {m['equivalent']} | "
            f"{m['no tests']} | {m['run failures']} | {_pct(m['strength'])} |" for m in module_rows(records)]
    out += ["", f"### Unexplained survivors: {len(unexplained)}", ""]
    survivors = sorted(unexplained, key=lambda r: r.name)
    out += [f"- `{r.name}` (`{r.path}`, `{r.function}`)" for r in survivors] or ["None."]
    return "\n".join(out) + "\n"


def html(records: list[MutantRecord], summary: dict, extra: dict) -> str:
    """The same figures as an HTML block for the offline report page (no script, no stylesheet)."""
    problems = extra.get("problems", [])
    baseline = extra.get("baseline") or {}
    unexplained = sorted((r for r in records if r.status == "survived" and not r.equivalent), key=lambda r: r.name)
    rows = "".join(f"<tr><td><code>{escape(m['module'])}</code></td><td>{m['mutants']}</td><td>{m['killed']}</td>"
                   f"<td>{m['unexplained']}</td><td>{m['equivalent']}</td><td>{m['no tests']}</td>"
                   f"<td>{m['run failures']}</td><td>{_pct(m['strength'])}</td></tr>" for m in module_rows(records))
    return (f'<section id="job-summary"><h2>Mutation testing: {escape(decision(problems))}</h2>'
            f"<p>mutation score {_pct(summary['mutation_score'])} of {summary['total']}; test strength "
            f"{_pct(summary['test_strength'])} (baseline {_pct(baseline.get('test_strength'))}); "
            f"{summary['survivors_unexplained']} unexplained survivors; {summary['run_failures']} run failures</p>"
            + "".join(f"<p class=problem>{escape(p)}</p>" for p in problems)
            + '<table id="per-module"><tr><th>module</th><th>mutants</th><th>killed</th><th>unexplained</th>'
            f"<th>equivalent</th><th>no tests</th><th>run failures</th><th>test strength</th></tr>{rows}</table>"
            + "".join(f"<p class=survivor><code>{escape(r.name)}</code></p>" for r in unexplained)
            + "</section>")
