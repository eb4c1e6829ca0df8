"""Every bad argument of the `specgate` command ends in one line, `specgate: error: ...` naming
the flag, exit status 2, and never a traceback or a pytest dump. main() runs in-process: each
refusal happens before an engine, a pytest session or a proof starts, so these are fast."""
import pytest

from specgate_cli import main


def refusal(capsys, argv: list[str]) -> str:
    """Run the command; it must exit 2 with exactly one stderr line; that line is returned."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert status == 2, (status, out.err)
    assert len(lines) == 1 and lines[0].startswith("specgate: error: "), out.err
    assert "Traceback" not in out.err + out.out
    return lines[0]


@pytest.mark.parametrize("argv, words", [
    (["bench", "--concurrency", "1,x"], ["--concurrency", "'x'"]),
    (["bench", "--concurrency", "0"], ["--concurrency", "[1, 256]", "got 0"]),
    (["bench", "--concurrency", "1,,8"], ["--concurrency", "comma-separated"]),
    (["bench", "--legs", "0"], ["--legs", ">= 1", "got 0"]),
    (["bench", "--legs", "three"], ["--legs", "'three'"]),
    (["bench", "--warmup-legs", "-1"], ["--warmup-legs", ">= 0"]),
    (["bench", "--num-prompts", "0"], ["--num-prompts"]),
    (["bench", "--max-tokens", "0"], ["--max-tokens"]),
    (["bench", "--temperature", "-1"], ["--temperature"]),
    (["bench", "--json", "/nonexistent-dir/b.json"], ["--json", "does not exist"]),
    (["bench", "--plot", "/nonexistent-dir/b.png"], ["--plot", "does not exist"]),
    (["bench", "--max-model-len", "1"], ["--max-model-len"]),
    (["generate", "--prompt", "x", "--max-tokens", "-3"], ["--max-tokens"]),
    (["generate", "--prompt", "x", "--top-p", "0"], ["--top-p", "(0.0, 1.0]"]),
    (["generate", "--prompt", "x", "--top-p", "nan"], ["--top-p"]),
    (["generate", "--prompt", "x", "--top-k", "-2"], ["--top-k"]),
    (["generate", "--prompt", "x", "--seed", "s"], ["--seed"]),
    (["generate", "--prompt", "x", "--num-spec-tokens", "0"], ["--num-spec-tokens"]),
    (["generate", "--prompt", "x", "--model", "/nonexistent"], ["--model", "no such folder: /nonexistent"]),
    (["generate", "--prompt", "x", "--drafter", "/nonexistent"], ["--drafter", "no such folder"]),
    (["generate", "--prompt", "x", "--device", "gpu"], ["--device", "'gpu'"]),
    (["generate"], ["--prompt"]),
    (["gates", "run", "reason-a", "--model", "/nonexistent"], ["--model", "no such folder"]),
    (["gates", "run", "--busy-threshold", "2"], ["--busy-threshold"]),
    (["gates", "run", "--dtype", "float16"], ["--dtype"]),
    (["gates", "run", "--json", "/nonexistent-dir/g.json"], ["--json"]),
    (["gates", "run", "no-such-gate"], ["no-such-gate"]),
    (["prove", "--jobs", "0"], ["--jobs"]),
    (["prove", "--timeout", "-5"], ["--timeout"]),
    (["prove", "no-such-defect"], ["no-such-defect"]),
    (["mutate", "--max-children", "0"], ["--max-children"]),
    (["bench-model", "decode", "--attention-backends", "flash"], ["--attention-backends", "sdpa, flex", "'flash'"]),
    (["bench-model", "decode", "--attention-backends", "sdpa,sdpa"], ["--attention-backends", "distinct"]),
    (["bench-model", "decode", "--runners", "sync,"], ["--runners", "'sync,'"]),
    (["bench-model", "decode", "--compile", "yes"], ["--compile", "off, on"]),
    (["nonsense"], ["nonsense"]),
])
def test_bad_argument_is_one_line_naming_it(capsys, argv, words):
    line = refusal(capsys, argv)
    for word in words:
        assert word in line, line


def test_one_leg_with_the_default_warmup_is_refused(capsys):
    line = refusal(capsys, ["bench", "--legs", "1"])
    assert "--legs 1" in line and "--warmup-legs 1" in line and "no warm leg" in line


def test_max_model_len_beyond_the_model_is_refused(capsys):
    line = refusal(capsys, ["generate", "--prompt", "x", "--max-model-len", "4096"])
    assert "--max-model-len" in line and "max_position_embeddings (1024)" in line


def test_gates_run_refuses_a_folder_that_is_no_model(capsys, tmp_path):
    line = refusal(capsys, ["gates", "run", "reason-a", "--model", str(tmp_path)])
    assert "--model" in line and "config.json" in line and "Hypothesis" not in line


def test_a_prompt_cut_by_the_context_says_so(capsys):
    """A 500-character prompt with 64 tokens asked for and a 512-token context: the completion is
    cut by the context, finish 'context' (not max_tokens' 'length'), and a warning line says so."""
    status = main(["generate", "--prompt", "x = 1\n" * 84, "--max-tokens", "64", "--max-model-len", "512"])
    err = capsys.readouterr().err
    assert status == 0
    assert "finish context" in err and "context 512" in err
    assert "specgate: warning: the completion was cut at 7 of --max-tokens 64" in err


def test_the_default_context_is_the_models(capsys):
    assert main(["generate", "--prompt", "def f(", "--max-tokens", "2"]) == 0
    assert "context 1024" in capsys.readouterr().err  # the fixture's max_position_embeddings


def test_bench_prints_a_line_per_leg_and_the_paths_it_wrote(capsys, tmp_path):
    """Not on a terminal (captured): a line per finished leg instead of a bar; the JSON holds the
    figures the PNG draws; the last lines name the files written."""
    import json
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    assert main(["bench", "--concurrency", "1,2", "--legs", "2", "--num-prompts", "2", "--max-tokens", "4",
                 "--json", str(out_json), "--plot", str(out_png)]) == 0
    out, err = capsys.readouterr()
    legs = [line for line in err.splitlines() if line.startswith("bench: c=")]
    assert [line.split(":")[1] for line in legs] == [" c=1 leg 0 (warm-up)", " c=1 leg 1 (warm)",
                                                     " c=2 leg 0 (warm-up)", " c=2 leg 1 (warm)"]
    assert out.splitlines()[-2:] == [f"wrote {out_json}", f"wrote {out_png}"]
    report = json.loads(out_json.read_text())
    assert report["figures"]["2"]["fold"]["warm_legs"] == [1] and report["max_model_len"] == 1024
    assert out_png.stat().st_size > 10000


def test_comma_lists_take_their_values_in_any_order():
    """`--attention-backends flex,sdpa` was refused while `sdpa,flex` ran (a device call lost to
    it): a comma list of choices takes any order and keeps it."""
    from gates.argtypes import choice_list
    backends = choice_list("sdpa", "flex")
    assert backends("flex,sdpa") == ("flex", "sdpa") and backends(" sdpa ") == ("sdpa",)
