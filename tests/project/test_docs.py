"""What a newcomer reads agrees with the code: the README's gate table says what `specgate gates
list` says, no Markdown file links outside the repository, and each relative link resolves."""
import re
from pathlib import Path

from gates.registry import GATES

REPO = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", "build", "reports", "node_modules", ".hypothesis", ".pytest_cache"}


def markdown_files() -> list[Path]:
    return [p for p in REPO.rglob("*.md") if not SKIP & set(p.relative_to(REPO).parts)]


def test_the_readme_gate_table_needs_what_gates_list_says():
    rows = dict(re.findall(r"^\| `([a-z-]+)`(?: \(G\d\))? \| (cpu|cuda) \|", (REPO / "README.md").read_text(), re.M))
    assert rows == {g.name: g.needs for g in GATES}


def test_markdown_links_stay_inside_the_repository_and_resolve():
    bad = []
    for md in markdown_files():
        for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            path = (md.parent / target.split("#")[0]).resolve()
            if target.startswith("/") or not path.is_relative_to(REPO) or not path.exists():
                bad.append(f"{md.relative_to(REPO)}: {target}")
    assert not bad, bad
