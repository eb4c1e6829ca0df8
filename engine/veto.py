"""The veto: the one place that decides whether a run uses the async runner, and hands out
that runner's policy (engine/policy.py: what the two runners do differently).

Speculative decoding with the async runner is refused unless evidence says it is safe: the
committed evidence file (engine/veto-evidence.json, written by `specgate gates verdict --record`
after the gates ran on a GPU) lifts the veto when it says LIFT for this very engine (the sha256 of
every engine/ source file it judged equals this engine's), for the device kind, the forward
(reference or compiled), the arm (graph or eager) and the attention backend (sdpa, flex, paged:
each reads the cache with kernels of its own) the run uses. The verdict lifts the graph arm
only: there a step is one replay and the async runner hides the host's work behind it (ahead of
sync beyond the floor in every A/B on the H200), while the eager arm is bound by the host
launching kernels and async never gained there (under the floor, or behind at c=1). Any edit to
an engine file re-arms the veto until the gates run again: the evidence is then stale, and one log
line says so and how to refresh it. The engine reads the file as data and imports nothing from
the gates.

VT_ASYNC_RUNNER=1 or LLM(..., async_runner=True) lifts the veto for a run whatever the evidence,
VT_ASYNC_RUNNER=0 or async_runner=False forces the sync runner. Plain decoding runs async by default.
"""
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from engine.attention import ATTENTION_BACKENDS
from engine.config import ARMS, FORWARDS
from engine.defaults import resolve_attention_backend
from engine.errors import SpecgateError
from engine.policy import RunnerPolicy

log = logging.getLogger("specgate")
ENV_VAR = "VT_ASYNC_RUNNER"
ENGINE_DIR = Path(__file__).resolve().parent
EVIDENCE_FILE = ENGINE_DIR / "veto-evidence.json"
LIFT, KEEP = "LIFT", "KEEP"
DEVICE_KINDS = ("cpu", "cuda")  # what evidence may name, with engine/config.py's FORWARDS and ARMS
REFRESH = ("run the gates on a GPU (scripts/gpu-check.sh env gates verdict), then "
           "`specgate gates verdict REPORT.json ... --record`")


def source_hash(root: Path, suffixes: tuple[str, ...] = (".py",)) -> str:
    """sha256 over every file under `root` with one of `suffixes` (path and bytes, sorted by path),
    caches left out: the identity of a source tree that evidence and reports record."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.suffix in suffixes and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def engine_source_hash(root: Path | None = None) -> str:
    return source_hash(root or ENGINE_DIR)


@dataclass(frozen=True)
class Evidence:
    """What `specgate gates verdict --record` wrote: the decision, and what it judged."""
    decision: str                  # LIFT or KEEP
    engine_sha256: str             # engine_source_hash() of the engine the gates ran
    devices: tuple[str, ...]       # device kinds the gates ran on ("cuda")
    forwards: tuple[str, ...]      # forwards the gates judged: "reference" (compile=False), "compiled"
    arms: tuple[str, ...] = ()     # arms the decision covers: "graph" (graph=True), "eager"; none: no arm
    attention_backends: tuple[str, ...] = ()  # EngineConfig.attention_backend values the gates judged

    @classmethod
    def read(cls, path: Path) -> "Evidence":
        """Raises ValueError, saying why, for a file that is not usable evidence."""
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {path}: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path} is not a JSON object")
        try:
            # evidence from before arms or attention backends were recorded lifts none of them
            out = cls(raw["decision"], raw["engine_sha256"], tuple(raw["devices"]), tuple(raw["forwards"]),
                      tuple(raw.get("arms", ())), tuple(raw.get("attention_backends", ())))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path} lacks {e} (it must hold decision, engine_sha256, devices, forwards)") from None
        if out.decision not in (LIFT, KEEP):
            raise ValueError(f"{path}: decision must be {LIFT} or {KEEP}, got {out.decision!r}")
        for field, known in (("devices", DEVICE_KINDS), ("forwards", FORWARDS), ("arms", ARMS),
                             ("attention_backends", ATTENTION_BACKENDS)):
            unknown = sorted(set(getattr(out, field)) - set(known))
            if unknown:
                raise ValueError(f"{path}: {field} names {unknown}, not among {list(known)}")
        return out


def evidence_refusal(device: str, compiled: bool, graph: bool, path: Path | None = None,
                     attention_backend: str | None = None) -> str | None:
    """None when the evidence lifts the veto for a run on `device` with this forward, arm and
    attention backend (None: the device's default); otherwise why it does not, in one line."""
    path = Path(path or EVIDENCE_FILE)
    if not path.is_file():
        return f"no veto evidence ({path.name} is missing): {REFRESH}"
    try:
        evidence = Evidence.read(path)
    except ValueError as e:
        return f"the veto evidence is unusable ({e}): {REFRESH}"
    if evidence.decision != LIFT:
        return f"the veto evidence says {evidence.decision} ({path.name})"
    this_engine = engine_source_hash()
    if evidence.engine_sha256 != this_engine:
        return (f"the veto evidence is stale: it judged engine {evidence.engine_sha256[:12]}, this engine's sources "
                f"are {this_engine[:12]} (an engine file changed since): {REFRESH}")
    kind = device.split(":")[0]
    if kind not in evidence.devices:
        return f"the veto evidence covers {', '.join(evidence.devices)} runs, not {kind}"
    forward = "compiled" if compiled else "reference"
    if forward not in evidence.forwards:
        return f"the veto evidence judged the {' and '.join(evidence.forwards)} forward, not the {forward} one"
    arm = ARMS[bool(graph)]
    if arm not in evidence.arms:
        covers = f"the {' and '.join(evidence.arms)} arm" if evidence.arms else "no arm"
        return (f"the veto evidence lifts {covers}, not the {arm} arm (the async runner gains only where a "
                f"step is one graph replay: docs/async-runner.md)")
    backend = resolve_attention_backend(attention_backend, device)
    if backend not in evidence.attention_backends:
        judged = (f"the {' and '.join(evidence.attention_backends)} attention backend" if evidence.attention_backends
                  else "no attention backend")
        return f"the veto evidence judged {judged}, not {backend} (EngineConfig.attention_backend)"
    return None


def use_async_runner(spec: str | None, requested: bool | None, device: str, compiled: bool = False,
                     graph: bool = False, evidence: Path | None = None, attention_backend: str | None = None) -> bool:
    env = os.environ.get(ENV_VAR)
    if env not in (None, "", "0", "1"):
        raise SpecgateError(f"{ENV_VAR} must be 0 or 1, got {env!r}")
    if env == "0":
        return False
    if env == "1" or requested:
        return True
    if requested is False:
        return False
    if spec is not None:
        why = evidence_refusal(device, compiled, graph, evidence, attention_backend)
        if why is None:
            log.info("async runner for speculative decoding (spec=%s): the veto is lifted by %s", spec,
                     Path(evidence or EVIDENCE_FILE).name)
            return True
        log.warning("async runner vetoed for speculative decoding (spec=%s): %s; using the sync runner "
                    "(--async-runner, %s=1 or async_runner=True lifts it for a run)", spec, why, ENV_VAR)
        return False
    return True


def runner_policy(spec: str | None, requested: bool | None, device: str, compiled: bool = False,
                  graph: bool = False, attention_backend: str | None = None) -> RunnerPolicy:
    return RunnerPolicy(is_async=use_async_runner(spec, requested, device, compiled, graph,
                                                  attention_backend=attention_backend))
