"""Copy the source tree to a temporary folder and apply a seeded defect there.

A defect is a unified diff (mutants/proof/patches/<name>.diff) against the engine. Each hunk is
applied as an exact rewrite: its old lines (context and '-') must occur exactly once in the
file, ignoring the line numbers in the header, and are replaced by its new lines (context and
'+'). A hunk whose old lines occur nowhere or more than once makes the defect *stale*: the code
moved under it and it must be re-seeded; it is never skipped or applied fuzzily.

Nothing here writes outside the folder it is given: the working tree is only ever read.
"""
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

HUNK_HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


class StalePatch(Exception):
    """The defect no longer applies to this tree: re-seed it."""


@dataclass
class Hunk:
    path: str
    old: list[str]   # lines with their newlines, as in the file
    new: list[str]


def parse_patch(text: str) -> list[Hunk]:
    """The hunks of a unified diff with a/ and b/ prefixes (`git diff`, `diff -u`). A hunk's
    body is read by the line counts in its header, so a removed line that starts with '--'
    is not taken for a file header; lines between hunks (diff, index, ---) are headers."""
    hunks: list[Hunk] = []
    lines = text.splitlines(keepends=True)
    path, i = None, 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("+++ "):
            name = line[4:].rstrip("\n").split("\t")[0]
            if not name.startswith("b/"):
                raise ValueError(f"patch target {name!r} has no b/ prefix")
            path = name[2:]
            continue
        header = HUNK_HEADER.match(line)
        if not header:
            continue
        if path is None:
            raise ValueError("a hunk before any +++ line")
        old_left, new_left = (int(n) if n is not None else 1 for n in header.groups())
        hunk = Hunk(path, [], [])
        while old_left > 0 or new_left > 0:
            if i == len(lines):
                raise ValueError(f"hunk {len(hunks) + 1} of {path} ends early")
            body = lines[i]
            i += 1
            kind, content = (body[:1], body[1:]) if body != "\n" else (" ", "\n")
            content = content if content.endswith("\n") else content + "\n"
            if kind == "\\":
                continue  # "\ No newline at end of file"
            if kind not in " -+":
                raise ValueError(f"unexpected line in hunk {len(hunks) + 1} of {path}: {body!r}")
            if kind in " -":
                hunk.old.append(content)
                old_left -= 1
            if kind in " +":
                hunk.new.append(content)
                new_left -= 1
        if old_left < 0 or new_left < 0:
            raise ValueError(f"hunk {len(hunks) + 1} of {path}: line counts do not match its header")
        hunks.append(hunk)
    if not hunks:
        raise ValueError("the patch has no hunks")
    return hunks


def patched_files(patch_text: str, read) -> dict[str, str]:
    """path -> new text of every file the patch touches; `read(path)` gives a file's current
    text (None when it does not exist). Raises StalePatch when a hunk does not match exactly once."""
    out: dict[str, str] = {}
    for i, hunk in enumerate(parse_patch(patch_text), 1):
        if hunk.path not in out:
            current = read(hunk.path)
            if current is None:
                raise StalePatch(f"hunk {i}: {hunk.path} does not exist")
            out[hunk.path] = current
        text, old, new = out[hunk.path], "".join(hunk.old), "".join(hunk.new)
        count = text.count(old)
        if count != 1:
            where = "nowhere" if count == 0 else f"{count} times"
            first = next((ln.strip() for ln in hunk.old if ln.strip()), "")
            raise StalePatch(f"hunk {i} of {hunk.path} (at {first!r}) matches {where}, not exactly once")
        out[hunk.path] = text.replace(old, new, 1)
    return out


def inside(root: Path, rel: str) -> Path:
    """root/rel, refusing any path that would leave root."""
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()) or Path(rel).is_absolute():
        raise ValueError(f"patch path {rel!r} leaves the tree")
    return path


def apply_patch(patch_text: str, root: Path) -> list[str]:
    """Apply the patch to the tree at `root` (a temporary copy); returns the paths changed."""
    root = Path(root)

    def read(rel):
        path = inside(root, rel)
        return path.read_text() if path.is_file() else None
    files = patched_files(patch_text, read)
    for rel, text in files.items():
        inside(root, rel).write_text(text)
    return sorted(files)


NOT_SOURCE = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "build", "reports"}


def source_files(repo: Path) -> list[str]:
    """What a copy of the tree holds: tracked files and untracked ones git does not ignore
    (new modules not yet committed count), that exist now. Outside a git checkout (a bare copy
    of the tree): every file but caches, virtual environments and build output."""
    repo = Path(repo)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=repo, capture_output=True)
    if listed.returncode == 0 and (repo / ".git").exists():
        names = listed.stdout.decode().split("\0")
    else:
        names = [str(p.relative_to(repo)) for p in repo.rglob("*")
                 if not any(part in NOT_SOURCE or part.endswith(".egg-info") for part in p.relative_to(repo).parts)
                 and not p.name.endswith(".pyc")]
    return sorted({f for f in names if f and (repo / f).is_file() and not (repo / f).is_symlink()})


def copy_tree(repo: Path, dest: Path, files: list[str] | None = None) -> Path:
    """Copy the source files of `repo` to `dest` (a new folder); the repository is only read."""
    repo, dest = Path(repo), Path(dest)
    dest.mkdir(parents=True)
    for rel in files if files is not None else source_files(repo):
        target = inside(dest, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)
    return dest
