"""The veto lifted by committed evidence and re-armed by any engine edit (engine/veto.py): evidence
that says LIFT for this engine's very sources lifts it for the device kinds, forwards and arms it
covers; an edit to any engine file, KEEP, a missing or malformed file, another device, forward, arm
or attention backend keep it,
each with one line that says why; the runner flags and VT_ASYNC_RUNNER override either way."""
import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest

from engine import veto

ENGINE = Path(veto.__file__).resolve().parent


def write_evidence(path: Path, root: Path | None = None, **overrides) -> Path:
    data = {"decision": "LIFT", "engine_sha256": veto.engine_source_hash(root), "devices": ["cuda"],
            "forwards": ["reference"], "arms": ["graph"], "attention_backends": ["paged", "sdpa"]} | overrides
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def engine_copy(tmp_path, monkeypatch):
    """A copy of engine/ the veto hashes, and its evidence file, in place of the real ones."""
    root = tmp_path / "engine"
    shutil.copytree(ENGINE, root, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    monkeypatch.setattr(veto, "ENGINE_DIR", root)
    monkeypatch.setattr(veto, "EVIDENCE_FILE", root / "veto-evidence.json")
    monkeypatch.delenv(veto.ENV_VAR, raising=False)
    return root


def test_fresh_lift_evidence_lifts_the_veto_for_spec_decoding_on_cuda(engine_copy, caplog):
    write_evidence(veto.EVIDENCE_FILE, engine_copy)
    with caplog.at_level(logging.INFO, logger="specgate"):
        assert veto.runner_policy("ngram", None, device="cuda:0", graph=True).is_async
    assert "the veto is lifted by veto-evidence.json" in caplog.text


def test_a_lift_is_one_info_line_that_names_the_decoding_and_the_evidence_file(engine_copy, caplog):
    """What a run's log keeps of a lifted veto: one line, the drafter it was lifted for and the
    file that lifted it, ending with the file's name."""
    write_evidence(veto.EVIDENCE_FILE, engine_copy)
    with caplog.at_level(logging.INFO, logger="specgate"):
        assert veto.use_async_runner("block", None, "cuda", graph=True)
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "specgate"] == [
        ("INFO", "async runner for speculative decoding (spec=block): the veto is lifted by veto-evidence.json")]


@pytest.mark.parametrize("name", sorted(p.relative_to(ENGINE).as_posix() for p in ENGINE.rglob("*.py")
                                        if "__pycache__" not in p.parts))
def test_an_edit_to_any_engine_file_rearms_the_veto_with_the_stale_line(engine_copy, name, caplog):
    write_evidence(veto.EVIDENCE_FILE, engine_copy)
    with (engine_copy / name).open("a") as f:
        f.write("\n# an edit\n")
    with caplog.at_level(logging.WARNING, logger="specgate"):
        assert not veto.runner_policy("block", None, device="cuda", graph=True).is_async
    judged, now = veto.Evidence.read(veto.EVIDENCE_FILE).engine_sha256, veto.engine_source_hash()
    assert (f"the veto evidence is stale: it judged engine {judged[:12]}, this engine's sources are {now[:12]} "
            f"(an engine file changed since): {veto.REFRESH}") in caplog.text
    assert "specgate gates verdict REPORT.json ... --record" in caplog.text


@pytest.mark.parametrize("content, why", [
    (None, "no veto evidence (veto-evidence.json is missing)"),
    ("{not json", "the veto evidence is unusable (cannot read"),
    ("[1, 2]", "is not a JSON object"),
    ('{"decision": "LIFT"}', "lacks 'engine_sha256'"),
    ('{"decision": "MAYBE", "engine_sha256": "x", "devices": [], "forwards": []}', "decision must be LIFT or KEEP"),
    ('{"decision": "LIFT", "engine_sha256": "x", "devices": ["cuda", "rocm"], "forwards": []}',
     "devices names ['rocm'], not among ['cpu', 'cuda']"),
    ('{"decision": "LIFT", "engine_sha256": "x", "devices": [], "forwards": ["fused"]}',
     "forwards names ['fused'], not among ['reference', 'compiled']"),
    ('{"decision": "LIFT", "engine_sha256": "x", "devices": [], "forwards": [], "arms": ["graph", "replay"]}',
     "arms names ['replay'], not among ['eager', 'graph']"),
    ('{"decision": "LIFT", "engine_sha256": "x", "devices": [], "forwards": [], "attention_backends": ["flash"]}',
     "attention_backends names ['flash'], not among ['sdpa', 'flex', 'paged']"),
], ids=["missing", "not-json", "not-an-object", "a-field-missing", "bad-decision", "unknown-device",
        "unknown-forward", "unknown-arm", "unknown-attention-backend"])
def test_a_missing_or_malformed_file_keeps_the_veto_and_says_why(engine_copy, content, why, caplog):
    if content is not None:
        veto.EVIDENCE_FILE.write_text(content)
    with caplog.at_level(logging.WARNING, logger="specgate"):
        assert not veto.runner_policy("ngram", None, device="cuda", graph=True).is_async
    assert why in caplog.text and "using the sync runner" in caplog.text


@pytest.mark.parametrize("overrides, device, compiled, graph, why", [
    ({"decision": "KEEP"}, "cuda", False, True, "the veto evidence says KEEP"),
    ({}, "cpu", False, True, "covers cuda runs, not cpu"),
    ({}, "cuda", True, True, "judged the reference forward, not the compiled one"),
    ({"devices": []}, "cuda", False, True, "covers  runs, not cuda"),
    ({}, "cuda", False, False, "lifts the graph arm, not the eager arm"),
    ({"arms": []}, "cuda", False, True, "lifts no arm, not the graph arm"),
    ({"attention_backends": ["sdpa"]}, "cuda", False, True,
     "judged the sdpa attention backend, not paged (EngineConfig.attention_backend)"),
    ({"attention_backends": ["flex", "sdpa"]}, "cuda", False, True,
     "the veto evidence judged the flex and sdpa attention backend, not paged (EngineConfig.attention_backend)"),
    ({"attention_backends": []}, "cuda", False, True, "the veto evidence judged no attention backend, not paged"),
], ids=["keep", "cpu", "compiled", "no-device", "eager-arm", "no-arm", "cuda-default-paged", "two-backends",
        "no-backend"])
def test_evidence_keeps_the_veto_outside_what_it_judged(engine_copy, overrides, device, compiled, graph, why):
    write_evidence(veto.EVIDENCE_FILE, engine_copy, **overrides)
    assert why in veto.evidence_refusal(device, compiled, graph)
    assert not veto.use_async_runner("ngram", None, device, compiled, graph)


@pytest.mark.parametrize("backend", ["sdpa", "flex", "paged"])
def test_evidence_lifts_the_veto_only_for_the_attention_backends_it_judged(engine_copy, backend):
    """A backend named by the run (or the device's default, paged on CUDA) must be one the gates
    judged: each backend reads the cache with kernels of its own, and the gates ran only those."""
    write_evidence(veto.EVIDENCE_FILE, engine_copy, attention_backends=[backend])
    for other in ("sdpa", "flex", "paged"):
        lifted = veto.use_async_runner("ngram", None, "cuda", graph=True, attention_backend=other)
        assert lifted is (other == backend)
        assert veto.runner_policy("ngram", None, "cuda", graph=True, attention_backend=other).is_async is lifted
    assert veto.use_async_runner("ngram", None, "cuda", graph=True) is (backend == "paged")  # CUDA's default


@pytest.mark.parametrize("field, why", [("arms", "lifts no arm"), ("attention_backends", "no attention backend")])
def test_evidence_from_before_a_field_was_recorded_lifts_none_of_it(engine_copy, field, why):
    data = json.loads(write_evidence(veto.EVIDENCE_FILE, engine_copy).read_text())
    del data[field]
    veto.EVIDENCE_FILE.write_text(json.dumps(data))
    assert why in veto.evidence_refusal("cuda", False, True)


def test_the_flags_and_the_environment_override_the_evidence_either_way(engine_copy, monkeypatch):
    write_evidence(veto.EVIDENCE_FILE, engine_copy)
    assert veto.use_async_runner("ngram", None, "cuda", graph=True)     # the evidence lifts it
    assert not veto.use_async_runner("ngram", False, "cuda", graph=True)  # async_runner=False
    monkeypatch.setenv(veto.ENV_VAR, "0")
    assert not veto.use_async_runner("ngram", None, "cuda", graph=True)   # VT_ASYNC_RUNNER=0 beats LIFT
    veto.EVIDENCE_FILE.unlink()
    monkeypatch.setenv(veto.ENV_VAR, "1")
    assert veto.use_async_runner("ngram", None, "cuda")                 # VT_ASYNC_RUNNER=1 without evidence
    monkeypatch.delenv(veto.ENV_VAR)
    assert veto.use_async_runner("ngram", True, "cpu")                  # async_runner=True without evidence
    assert veto.use_async_runner(None, None, "cpu")                     # plain decoding: async by default


def test_the_hash_covers_every_python_file_and_nothing_else(engine_copy):
    before = veto.engine_source_hash()
    (engine_copy / "notes.txt").write_text("not source")
    (engine_copy / "__pycache__").mkdir(exist_ok=True)
    (engine_copy / "__pycache__" / "x.py").write_text("cache")
    assert veto.engine_source_hash() == before
    (engine_copy / "bench" / "new.py").write_text("")
    assert veto.engine_source_hash() != before


def test_the_hash_is_reproducible_from_its_definition(tmp_path):
    """sha256 over each file's relative path, NUL, its bytes, NUL, in the order of the paths'
    components (a/c.py before a.py): what evidence and reports record, so any tool can recompute
    a tree's identity, and one file's bytes cannot pass for another's name."""
    files = {"b.py": b"x = 1\n", "a/c.py": b"", "a.py": b"y"}
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    order = sorted(files, key=lambda name: Path(name).parts)
    want = hashlib.sha256(b"".join(name.encode() + b"\0" + files[name] + b"\0" for name in order))
    assert veto.source_hash(tmp_path) == want.hexdigest()


def test_the_llm_hands_the_veto_its_device_forward_arm_and_attention_backend(make_llm, monkeypatch, tmp_path):
    """LLM(...) asks the veto with its own device, forward, arm and attention backend: evidence for
    CPU runs of the reference forward's graph arm with sdpa lifts an ngram engine there, and keeps
    the veto for the same engine compiled, in the eager arm or with flex attention."""
    monkeypatch.delenv(veto.ENV_VAR, raising=False)
    monkeypatch.setattr(veto, "EVIDENCE_FILE", write_evidence(tmp_path / "veto-evidence.json", devices=["cpu"],
                                                              attention_backends=["sdpa"]))
    assert make_llm(spec="ngram", graph=True).is_async
    assert not make_llm(spec="ngram", graph=True, compile=True).is_async
    assert not make_llm(spec="ngram", graph=False).is_async
    assert not make_llm(spec="ngram", graph=True, attention_backend="flex").is_async


def test_a_caller_that_names_no_arm_gets_the_eager_arm_which_graph_evidence_does_not_lift(engine_copy):
    """Evidence lifts the graph arm only (there async gains: one replay a step). A caller of the veto
    that does not say its arm is judged as the eager arm, so the evidence keeps the veto for it:
    left unsaid, the arm never turns the async runner on."""
    write_evidence(veto.EVIDENCE_FILE, engine_copy)
    assert veto.use_async_runner("ngram", None, "cuda", graph=True)
    assert not veto.use_async_runner("ngram", None, "cuda")
    assert not veto.runner_policy("ngram", None, device="cuda").is_async
