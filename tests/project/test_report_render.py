"""The HTML reports open offline and show what they hold, checked in a real browser: headless
Chromium (Debian's `chromium`, installed here by apt-get when missing and this runs as root)
renders each page from a file:// URL with networking off, takes a screenshot, and dumps the DOM.

The mutation report's viewer draws into a shadow root, which --dump-dom does not print: the test
renders a copy of the page with a probe script appended that copies the viewer's rendered text
into the light DOM. Screenshots land in $SPECGATE_SCREENSHOTS when set (else the test's folder).
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gates.report import GateResult
from mutants.mutation import viewer
from mutants.mutation.record import MutantRecord
from mutants.mutation.report import write_reports
from mutants.proof.catalogue import by_name
from mutants.proof.html import page
from mutants.proof.matrix import CLEAN, GREEN, RAN, RED, TreeRun, build_proof

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=10000", "--window-size=1280,900")
PROBE = """<script>
function texts(root) { let t = ""; for (const n of root.childNodes) { if (n.nodeType === 3) t += n.textContent + " ";
  else if (n.nodeType === 1) { if (n.shadowRoot) t += texts(n.shadowRoot); t += texts(n); } } return t; }
window.addEventListener("load", () => setTimeout(() => {
  const app = document.querySelector("mutation-test-report-app"), pre = document.createElement("pre");
  pre.id = "rendered";
  pre.textContent = app && app.shadowRoot ? texts(app.shadowRoot).replace(/\\s+/g, " ") : "NOT RENDERED";
  document.body.appendChild(pre); }, 2000));
</script></body>"""


@pytest.fixture(scope="session")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            subprocess.run(cmd, capture_output=True, timeout=900,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("no chromium, and it could not be installed here (needs root and apt-get: "
                    "`apt-get install chromium`)")
    return found


def browse(chromium: str, html: Path, tmp_path: Path, action: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{html.stem}-{action.strip('-').split('=')[0]}"  # a fresh profile each run
    return subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", action, html.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)


def screenshot(chromium: str, html: Path, tmp_path: Path) -> Path:
    out = Path(os.environ.get("SPECGATE_SCREENSHOTS") or tmp_path) / f"{html.stem}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = browse(chromium, html, tmp_path, f"--screenshot={out}")
    assert out.is_file() and out.stat().st_size > 5000, proc.stderr[-2000:]
    return out


SOURCE = "def add(a, b):\n    return a + b\n"
DIFF = "--- engine/m.py\n+++ engine/m.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a + b\n+    return a - b\n"


def test_the_mutation_report_renders_offline_with_its_counts(chromium, tmp_path):
    try:
        viewer.vendor()
    except viewer.ViewerUnavailable as e:
        pytest.skip(f"the viewer could not be vendored: {e}")
    statuses = ["killed"] * 5 + ["survived"] * 2 + ["no tests"]
    records = [MutantRecord(f"engine.m.x_add__mutmut_{i}", "engine/m.py", "add", s, DIFF, ("tests/t.py::test_add",))
               for i, s in enumerate(statuses, 1)]
    extra = {"problems": ["2 survivors in the mutated functions are neither killed nor listed"],
             "baseline": {"test_strength": 0.97, "commit": "ccdcb6d"}, "command": "specgate mutate merge",
             "commit": "x"}
    html = write_reports(tmp_path / "mutation", records, {"engine/m.py": SOURCE}, extra)["html"]
    text = html.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"?https?:", text)  # nothing to fetch
    probe = tmp_path / "mutation-probe.html"
    probe.write_text(text.replace("</body>", PROBE), encoding="utf-8")
    dom = browse(chromium, probe, tmp_path, "--dump-dom").stdout
    rendered = re.search(r'<pre id="rendered">(.*?)</pre>', dom, re.S).group(1)
    # the viewer's metrics row for all files: score of total, of covered, killed, survived, timeout,
    # no coverage, ignored, runtime errors, compile errors, detected, undetected, total
    assert "All files 62.50 71.43 5 2 0 1 0 0 0 5 3 8" in rendered, rendered
    assert "8 mutants: 5 killed, 2 survived, 1 no tests" in dom
    # the job summary's block, above the viewer: the ratchet's decision, the per-module table, each survivor
    summary = re.search(r'<section id="job-summary">(.*?)</section>', dom, re.S).group(1)
    assert "Mutation testing: FAIL (1 problem)" in summary and "neither killed nor listed" in summary
    assert re.search(r"<td><code>engine/m\.py</code></td><td>8</td><td>5</td><td>2</td><td>0</td><td>1</td><td>0</td>"
                     r"<td>71\.4%</td>", summary), summary
    assert summary.count('class="survivor"') == 2
    screenshot(chromium, html, tmp_path)


def test_the_proof_report_renders_offline_with_each_cell_linked_to_its_evidence(chromium, tmp_path):
    defects = by_name(["stale-drafts", "resample-from-p", "graph-warmup-on-real-batch"])
    evidence = [{"message": "emit counts differ", "differences": [{"what": "num_emitted", "step": 3, "request": 1,
                                                                    "expected": 2, "actual": 1}]}]
    runs = {"stale-drafts": TreeRun("stale-drafts", RAN, {
                "combine": GateResult("g", status=RED, reason="1 of 2 tests failed", evidence=evidence),
                "emit-count": GateResult("g", status=RED, reason="1 of 3 tests failed", evidence=evidence)}, 13.0),
            "resample-from-p": TreeRun("resample-from-p", RAN, {
                "lossless": GateResult("g", status=RED, reason="chi-square p = 1e-9")}, 50.0),
            "graph-warmup-on-real-batch": TreeRun("graph-warmup-on-real-batch", "needs CUDA")}
    needs = {"lossless": "cpu", "combine": "cpu", "emit-count": "cpu"}
    clean = TreeRun(CLEAN, RAN, {g: GateResult("g", status=GREEN, reason="12 cases") for g in needs}, 104.0)
    proof = build_proof(defects, runs, clean, needs, False, True, 180.0)
    html = tmp_path / "prove.html"
    html.write_text(page(proof, {"args": "", "wall_s": 180.0, "jobs": 2, "device": "cpu"}), encoding="utf-8")
    dom = browse(chromium, html, tmp_path, "--dump-dom").stdout
    assert "3 defects: 2 planted and run, 1 not run here; 3 gates; 0 problems" in dom
    assert "specgate proof: PASS" in dom
    links = re.findall(r'href="#([^"]+)"', dom)
    assert len(links) == 3 + 1 + 3 + 3  # every run cell (3 red, 3 green on the clean tree) and every tree's name
    ids = set(re.findall(r'id="([^"]+)"', dom))
    assert set(links) <= ids, set(links) - ids
    assert "&quot;step&quot;: 3" in dom or '"step": 3' in dom  # the evidence the red cell links to
    screenshot(chromium, html, tmp_path)
