"""`specgate generate/bench --async-runner/--sync-runner` choose the runner; without either the
veto decides (async_runner=None reaches the engine)."""
import pytest

import engine
from specgate_cli import main


def engine_kwargs(monkeypatch, argv: list[str]) -> dict:
    """The keyword arguments `specgate ARGV` builds its LLM with (the engine is never built)."""
    seen = {}

    class Stop(Exception):
        pass

    def fake_llm(model, **kwargs):
        seen.update(kwargs)
        raise Stop
    monkeypatch.setattr(engine, "LLM", fake_llm)
    with pytest.raises(Stop):
        main(argv)
    return seen


@pytest.mark.parametrize("flags, expected", [([], None), (["--async-runner"], True), (["--sync-runner"], False)])
def test_generate_passes_the_runner_choice_to_the_engine(monkeypatch, capsys, flags, expected):
    assert engine_kwargs(monkeypatch, ["generate", "--prompt", "def f(", "--spec", "ngram",
                                       *flags])["async_runner"] is expected


def test_the_two_runner_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--async-runner", "--sync-runner"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("flag, is_async", [("--async-runner", True), ("--sync-runner", False)])
def test_generate_runs_on_the_chosen_runner(monkeypatch, capsys, flag, is_async):
    monkeypatch.delenv("VT_ASYNC_RUNNER", raising=False)
    made = []
    real = engine.LLM

    def spy(model, **kwargs):
        made.append(real(model, **kwargs))
        return made[-1]
    monkeypatch.setattr(engine, "LLM", spy)
    assert main(["generate", "--prompt", "def f(", "--spec", "ngram", "--max-tokens", "4", flag]) == 0
    assert made[0].is_async is is_async


@pytest.mark.parametrize("command", ["generate", "bench"])
@pytest.mark.parametrize("flags, expected", [([], None), (["--compile"], True), (["--no-compile"], False)])
def test_compile_flag_reaches_the_engine(monkeypatch, capsys, command, flags, expected):
    """`--compile` selects the fused forward (EngineConfig.compile), `--no-compile` the reference; without
    either the engine decides by the device (None: compiled on CUDA, the reference on the CPU)."""
    extra = ["--prompt", "def f("] if command == "generate" else ["--legs", "2"]
    assert engine_kwargs(monkeypatch, [command, *extra, *flags])["compile"] is expected


@pytest.mark.parametrize("flags, device, expected", [([], "cpu", False), ([], "cuda", True), ([], "cuda:1", True),
                                                     (["--no-compile"], "cuda", False), (["--compile"], "cpu", True)])
def test_the_bench_report_names_the_forward_the_engine_runs(monkeypatch, capsys, flags, device, expected):
    """The bench's JSON says `compile` as the engine resolved it, not as the flags left it (None)."""
    from engine.bench import legs
    seen = {}

    class Stop(Exception):
        pass

    def fake_report(legs_run, workload, meta):
        seen.update(meta)
        raise Stop
    monkeypatch.setattr(legs, "run_bench", lambda *a, **k: [])
    monkeypatch.setattr(legs, "report", fake_report)
    with pytest.raises(Stop):
        main(["bench", "--legs", "2", "--device", device, *flags])
    assert seen["compile"] is expected
