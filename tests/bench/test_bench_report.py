"""`specgate bench` around its legs: the held-out workload, its fingerprint, the run over
concurrencies and legs, the JSON report and the plot. (What one leg records: test_bench_legs.py.)"""
from dataclasses import asdict
from types import SimpleNamespace

from engine.bench import legs as bench
from engine.bench.legs import Leg, Workload


class Corpus:
    """A stand-in for fixtures.corpus: files by name, in the order they are held out."""

    def __init__(self, files: dict[str, str | bytes]):
        self.files = files
        self.heldout_files = list(files)

    def read(self, rel: str) -> bytes:
        data = self.files[rel]
        return data if isinstance(data, bytes) else data.encode()


def test_heldout_prompts_start_at_the_first_def_and_skip_short_files():
    corpus = Corpus({"a.py": "import os\n\ndef main(x):\n" + "    x += 1\n" * 40 + "\ndef later():\n",
                     "short.py": "x = 1\n",
                     "b.py": "y = 2\n" * 50,
                     "c.py": "\ndef g():\n" + "    pass\n" * 40})
    w = bench.heldout_workload(corpus, num_prompts=2, prompt_chars=40, max_tokens=9, temperature=0.5)
    assert w.prompts == (corpus.files["a.py"][11:51], corpus.files["b.py"][:40])
    assert (w.max_tokens_json(), w.temperature) == (9, 0.5)
    every = bench.heldout_workload(corpus, num_prompts=5, prompt_chars=40, max_tokens=9).prompts
    assert every == (corpus.files["a.py"][11:51], corpus.files["b.py"][:40], corpus.files["c.py"][1:41])
    exact = bench.heldout_workload(Corpus({"e.py": "z" * 20}), 1, prompt_chars=40, max_tokens=9)
    assert exact.prompts == ("z" * 20,), "a snippet of exactly half the bytes still counts"
    assert bench.heldout_workload(Corpus({"e.py": "z" * 19}), 1, prompt_chars=40, max_tokens=9).prompts == ()
    odd = bench.heldout_workload(Corpus({"e.py": "z" * 20}), 1, prompt_chars=41, max_tokens=9)
    assert odd.prompts == ("z" * 20,), "half of 41 bytes is 20, rounded down"


def test_heldout_prompts_are_160_bytes_unless_asked_and_undecodable_bytes_are_replaced():
    w = bench.heldout_workload(Corpus({"a.py": "def f():\n" + "    x = 1\n" * 40}), 1, max_tokens=9)
    assert len(w.prompts[0]) == 160
    broken = bench.heldout_workload(Corpus({"b.py": b"def f(): return '\xff'\n" * 4}), 1, prompt_chars=40, max_tokens=9)
    assert broken.prompts == ("def f(): return '\ufffd'\n" * 2,)


def test_a_workload_fingerprint_names_its_prompts_tokens_and_temperature():
    w = Workload.uniform(["a", "b"], 8, 0.0)
    same = Workload.uniform(["a", "b"], 8, 0.0)
    assert w.fingerprint() == same.fingerprint() and len(w.fingerprint()) == 16
    others = [Workload.uniform(["b", "a"], 8, 0.0), Workload.uniform(["a", "b"], 9, 0.0),
              Workload.uniform(["a", "b"], 8, 0.5)]
    assert len({w.fingerprint(), *(o.fingerprint() for o in others)}) == 4


def test_run_bench_builds_one_engine_per_concurrency_and_runs_every_leg(monkeypatch):
    built, ran = [], []

    def make_llm(c):
        built.append(c)
        return SimpleNamespace(c=c)

    def run_leg(llm, workload, concurrency, index, warmup_legs):
        ran.append((llm.c, concurrency, index, warmup_legs))
        return index
    monkeypatch.setattr(bench, "run_leg", run_leg)
    legs = bench.run_bench(make_llm, Workload.uniform(["p"], 4, 0.0), [1, 8], legs=3, warmup_legs=2, progress=False)
    assert built == [1, 8]
    assert ran == [(c, c, i, 2) for c in (1, 8) for i in range(3)]
    assert legs == [0, 1, 2, 0, 1, 2]


def leg(c, i, warm, tps=10.0):
    acc = {"num_requests": 1, "completion_tokens": 4, "verify_steps": 2, "num_drafts": 2, "num_draft_tokens": 4,
           "num_accepted_tokens": 2, "accepted_per_position": [2], "mean_acceptance_length": 2.0,
           "acceptance_rate": 0.5, "accept_length": 2.0}
    return Leg(c, i, 3, 4, 0.0, 1.0, 1.0, tps, acc, warm)


def test_the_report_holds_the_workload_the_meta_every_leg_and_the_fold():
    w = Workload.uniform(["a", "b", "c"], 16, 0.7)
    legs = [leg(1, 0, False), leg(1, 1, True, 12.0)]
    out = bench.report(legs, w, {"spec": "ngram", "k": 4})
    assert out["workload"] == {"fingerprint": w.fingerprint(), "num_prompts": 3, "max_tokens": 16,
                               "temperature": 0.7}
    assert (out["spec"], out["k"]) == ("ngram", 4)
    assert out["legs"] == [asdict(x) for x in legs]
    assert out["summary"] == bench.fold(legs)


def test_the_plot_is_a_png(tmp_path):
    path = tmp_path / "bench.png"
    legs = [leg(1, 0, False), leg(1, 1, True), leg(8, 0, False, 30.0), leg(8, 1, True, 31.0)]
    bench.plot(bench.figures(legs, spec=False), path, "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
