"""Small Hugging Face Llama folders in the shape of published ones, built on the CPU without
downloads: random weights saved by transformers, and a byte-level BPE tokenizer trained here on a
slice of the standard library's source. Session-scoped: built once per test run."""
import json
import os
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers.clock import Clock

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"]
STDLIB_SLICE = ["textwrap.py", "string.py", "bisect.py", "heapq.py", "fnmatch.py", "shlex.py"]


def train_tokenizer(folder: Path, vocab_size: int = 400) -> None:
    """A Llama 3-style tokenizer.json (byte-level BPE, BOS added by the post-processor)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = [(stdlib / name).read_text() for name in STDLIB_SLICE]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text, trainer)
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{SPECIALS[0]}:0 $A:0", special_tokens=[(SPECIALS[0], bos)])])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1]}))


class TensorCopies(torch.overrides.TorchFunctionMode):
    """Records every Tensor.copy_ made inside it: (destination, source, keyword arguments)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            self.calls.append((args[0], args[1], dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


def save_llama(folder: Path, tokenizer_dir: Path, seed: int, embed_scale: float = 1.0, **config) -> Path:
    """Random-weight LlamaForCausalLM saved by transformers (initializer_range 0.2, so rope, norm
    and activation details change the greedy tokens), with the tokenizer files beside it."""
    import shutil

    import transformers
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    max_shard_size = config.pop("max_shard_size", None)
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab, initializer_range=0.2, **config)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # small embeddings: RMSNorm's epsilon then changes the tokens
        model.model.embed_tokens.weight.mul_(embed_scale)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def edit_json(path: Path, drop=(), **changes) -> None:
    raw = json.loads(path.read_text()) if path.is_file() else {}
    for name in drop:
        raw.pop(name, None)
    raw.update(changes)
    path.write_text(json.dumps(raw, indent=2))


@pytest.fixture(scope="session")
def hf_tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(folder)
    return folder


LLAMA3 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
              tie_word_embeddings=False, bos_token_id=0, eos_token_id=[1, 2, 3],
              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64})
LLAMA2 = dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=True,
              bos_token_id=0, eos_token_id=1, hidden_act="gelu_pytorch_tanh")


@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory, hf_tokenizer_dir) -> Path:
    """Llama 3.1-style: llama3 rope scaling in transformers 5's rope_parameters, theta 500,000,
    an eos_token_id list, untied head, GQA 4:1, head_dim given (16, not 64 / 8)."""
    return save_llama(tmp_path_factory.mktemp("llama3"), hf_tokenizer_dir, seed=3, **LLAMA3)


@pytest.fixture(scope="session")
def llama3_sharded_dir(tmp_path_factory, hf_tokenizer_dir) -> Path:
    """The same weights saved in shards of at most 40 kB through model.safetensors.index.json."""
    return save_llama(tmp_path_factory.mktemp("llama3_sharded"), hf_tokenizer_dir, seed=3,
                      max_shard_size="40KB", **LLAMA3)


@pytest.fixture(scope="session")
def llama2_dir(tmp_path_factory, hf_tokenizer_dir) -> Path:
    """Llama 2-style, in transformers 4's spelling: top-level rope_theta and a linear rope_scaling,
    no rms_norm_eps key (transformers' default 1e-6 applies), tied head, MHA, no head_dim, and a
    non-SiLU activation; add_bos_token given in tokenizer_config.json. Its embeddings are scaled
    down so that their mean square is near the epsilon, which then decides tokens."""
    folder = save_llama(tmp_path_factory.mktemp("llama2"), hf_tokenizer_dir, seed=2, embed_scale=0.003, **LLAMA2)
    edit_json(folder / "config.json", drop=("rope_parameters", "rms_norm_eps", "head_dim"),
              rope_theta=20000.0, rope_scaling={"type": "linear", "factor": 2.0})
    edit_json(folder / "tokenizer_config.json", add_bos_token=True, add_eos_token=False)
    (folder / "generation_config.json").unlink(missing_ok=True)
    return folder


@pytest.fixture(scope="session")
def cli_env():
    """`cli_env(**extra)`: the environment for a `python -m specgate_cli` child: ours and `extra`,
    with this repository first on PYTHONPATH (gates.run.with_repo_on_path)."""
    from gates.run import with_repo_on_path
    return lambda **extra: with_repo_on_path(dict(os.environ, **extra))


@pytest.fixture(scope="session")
def scripted_bench():
    """`run(concurrencies, legs, warmup_legs, script)`: engine.bench.legs.run_bench as `specgate bench`
    calls it, on stand-in engines and a stand-in clock: the generate call of leg (c, i) takes
    script[c, i] = (seconds, outputs) and returns those RequestOutputs. Returns the Legs.
    Session-scoped (Hypothesis refuses function-scoped fixtures); the clock is patched per call."""
    from engine.bench import legs as bench
    from engine.bench.workload import Workload

    def run(concurrencies: list[int], legs: int, warmup_legs: int, script: dict) -> list:
        clock = Clock(wall=1_700_000_000.0, perf=100.0)

        class ScriptedLLM:
            def __init__(self, concurrency: int):
                self.concurrency, self.index = concurrency, 0
                # what run_leg reads besides generate: the phase clock's slot and the spec name
                self.runner = SimpleNamespace(is_cuda=False)
                self.config = SimpleNamespace(spec=None)

            def generate(self, prompts, params, arrival_steps=None):
                seconds, outputs = script[self.concurrency, self.index]
                self.index += 1
                clock.perf += seconds
                clock.wall += seconds
                return outputs

        workload = Workload.uniform(["p"], max_tokens=4, temperature=0.0)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bench, "time", clock)
            return bench.run_bench(ScriptedLLM, workload, concurrencies, legs, warmup_legs, progress=False)
    return run


@pytest.fixture(scope="session")
def refusals_pair(make_llm):
    """A real sync/async pair with every refusal kind and preemption, ngram k=3 (gates.workloads'
    MIXED_REFUSALS): the runs the gates' single-run checks and comparisons are doctored from."""
    from gates.compare import runs_difference
    from gates.workloads import MIXED_REFUSALS, MIXED_REFUSALS_ENGINE, run_pair
    sync, async_ = run_pair(make_llm, MIXED_REFUSALS, spec="ngram", num_spec_tokens=3, **MIXED_REFUSALS_ENGINE)
    assert runs_difference(sync, async_) is None
    return sync, async_


@pytest.fixture(scope="session")
def bench_tiny_dir(tmp_path_factory) -> Path:
    """The benchmark model's tiny shape, seed 0, as `specgate bench-model write` makes it."""
    from engine.bench.models import write_bench_model
    return write_bench_model("tiny", seed=0, folder=tmp_path_factory.mktemp("bench") / "tiny-seed0")
