"""The mutation report's viewer, vendored: the pinned npm package mutation-testing-elements,
installed once into build/viewer/ (git-ignored) and inlined into mutation-report.html, so the
report opens offline. `python -m mutants.mutation.viewer` (`make viewer`) installs it ahead of time.

npm is asked for exactly the pinned version, from the registry only; nothing is fetched when the
report is opened.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE, VERSION = "mutation-testing-elements", "3.9.0"  # any 3.x viewer reads schema v2
VENDOR_DIR = Path(__file__).resolve().parents[2] / "build" / "viewer"
BUNDLE = "dist/mutation-test-elements.js"  # the browser bundle (package.json's "browser")


class ViewerUnavailable(RuntimeError):
    """The viewer could not be vendored (no npm, no registry)."""


def package_dir(vendor_dir: Path = VENDOR_DIR) -> Path:
    return vendor_dir / "node_modules" / PACKAGE


def vendor(vendor_dir: Path = VENDOR_DIR) -> Path:
    """Install the pinned viewer into vendor_dir unless that version is there; its bundle's path."""
    pkg = package_dir(vendor_dir)
    manifest = pkg / "package.json"
    if not (manifest.is_file() and json.loads(manifest.read_text()).get("version") == VERSION
            and (pkg / BUNDLE).is_file()):
        npm = shutil.which("npm")
        if npm is None:
            raise ViewerUnavailable(f"npm is not installed: cannot vendor {PACKAGE}@{VERSION} (install node and npm)")
        vendor_dir.mkdir(parents=True, exist_ok=True)
        cmd = [npm, "install", "--prefix", str(vendor_dir), "--no-audit", "--no-fund", "--no-save",
               "--ignore-scripts", f"{PACKAGE}@{VERSION}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode or not (pkg / BUNDLE).is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ViewerUnavailable(f"`{' '.join(cmd[1:])}` failed (exit {proc.returncode}): {tail[0]}")
    return pkg / BUNDLE


def inline_script(vendor_dir: Path = VENDOR_DIR) -> str:
    """The viewer's bundle, safe to put between <script> tags."""
    return vendor(vendor_dir).read_text(encoding="utf-8").replace("</script", "<\\/script")


if __name__ == "__main__":
    try:
        print(f"{PACKAGE}@{VERSION}: {vendor()}")
    except ViewerUnavailable as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        sys.exit(1)
