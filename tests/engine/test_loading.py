"""Loading checkpoint folders: what config.json may say, which file an error names, where the
loaded tensors live and in which dtype, and when the block drafter warns about its target.

Tiny configs and checkpoints are written into tmp_path; only the drafter-warning tests load the
committed fixtures.
Over 300 lines because one set of tiny configs and checkpoint writers serves every loading check."""
import hashlib
import json
import shutil
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.bench import load_cost
from engine.bench.load_cost import measure_load
from engine.block_drafter import BlockProposer, DFlashDraftModel, DrafterConfig, load_drafter
from engine.config import EngineConfig, ModelConfig
from engine.errors import ModelLoadError, SpecgateError
from engine.loader import WEIGHTS_FILE, file_sha256, load_model, load_weights, save_model
from engine.model import LlamaForCausalLM
from fixtures import DRAFTER_DIR

# One pytest-xdist worker builds the session's Hugging Face folders (and imports transformers):
# `make test` runs --dist loadgroup, which keeps this group together.
pytestmark = pytest.mark.xdist_group("hf-folders")

TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=260, hidden_size=8,
            intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=64, tie_word_embeddings=False)


def write_config(folder, raw):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def without(raw, *names):
    return {k: v for k, v in raw.items() if k not in names}


# ---- ModelConfig.from_dir ------------------------------------------------------------------

ACCEPTED = [  # (config.json, what the loaded config must hold)
    (without(TINY, "architectures"), {}),
    ({**TINY, "architectures": []}, {}),
    (without(TINY, "model_type"), {}),
    (without(TINY, "architectures", "model_type"), {}),
    ({**TINY, "architectures": ["LlamaForCausalLM", "Other"]}, {}),
    (without(TINY, "num_key_value_heads"), dict(num_key_value_heads=2)),
    ({**TINY, "eos_token_id": [257, 258]}, dict(eos_token_id=257, eos_token_ids=(257, 258))),
    ({**TINY, "eos_token_id": [3]}, dict(eos_token_id=3)),
    ({**TINY, "eos_token_id": 257, "bos_token_id": 256}, dict(eos_token_id=257, bos_token_id=256)),
    ({**TINY, "attention_bias": False, "mlp_bias": False, "rope_scaling": None}, {}),
    ({**TINY, "torch_dtype": "bfloat16", "pad_token_id": 258}, dict(dtype="bfloat16")),
    ({**TINY, "dtype": "float16"}, dict(dtype="float16")),
    (TINY, dict(rms_norm_eps=1e-6, hidden_act="silu", rope_theta=10000.0, rope_scaling=None, dtype=None)),
]


@pytest.mark.parametrize("raw, expected", ACCEPTED, ids=[str(i) for i in range(len(ACCEPTED))])
def test_llama_config_json_variants_load(tmp_path, raw, expected):
    cfg = ModelConfig.from_dir(write_config(tmp_path, raw))
    assert cfg.hidden_size == 8 and cfg.num_attention_heads == 2
    for name, value in expected.items():
        assert getattr(cfg, name) == value


REFUSED = [  # (config.json, the message after "<path>: ")
    ({**TINY, "model_type": "mistral"},
     "only the Llama architecture is supported, got model_type='mistral' architectures=['LlamaForCausalLM']"),
    ({**without(TINY, "architectures"), "model_type": "LLAMA"},
     "only the Llama architecture is supported, got model_type='LLAMA' architectures=['LlamaForCausalLM']"),
    ({**without(TINY, "model_type"), "architectures": ["llamaforcausallm"]},
     "only the Llama architecture is supported, got model_type=None architectures=['llamaforcausallm']"),
    ({**TINY, "attention_bias": True}, "attention_bias=True is not supported (biases on q/k/v/o projections)"),
    ({**TINY, "mlp_bias": True}, "mlp_bias=True is not supported (biases on the MLP projections)"),
    ({**TINY, "rope_scaling": {"type": "linear"}}, "rope_type='linear' needs factor"),
    ({**TINY, "rope_scaling": {"type": "yarn", "factor": 2.0}},
     "rope_type='yarn' is not supported (supported: default, linear, dynamic, llama3)"),
]


@pytest.mark.parametrize("raw, message", REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_non_llama_config_json_is_refused_by_name(tmp_path, raw, message):
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dir(write_config(tmp_path, raw))
    assert str(info.value) == f"{tmp_path / 'config.json'}: {message}"


# ---- DrafterConfig.from_dir ----------------------------------------------------------------

DRAFTER = dict(architectures=["DFlashDraftModel"], model_type="specgate_dflash", hidden_size=192,
               intermediate_size=16, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
               head_dim=48, vocab_size=260, aux_layers=[1, 3], block_size=4)

DRAFTER_REFUSED = [  # (config.json text, the message after "<path>")
    ("[1, 2]", " must hold a JSON object"),
    ('"drafter"', " must hold a JSON object"),
    (json.dumps({**DRAFTER, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}),
     ": not a block drafter: expected model_type='specgate_dflash' and architectures ['DFlashDraftModel'], "
     "got model_type='llama' architectures=['LlamaForCausalLM']"),
    (json.dumps(without(DRAFTER, "model_type", "architectures")),
     ": not a block drafter: expected model_type='specgate_dflash' and architectures ['DFlashDraftModel'], "
     "got model_type=None architectures=None"),
    (json.dumps(without(DRAFTER, "aux_layers", "block_size", "head_dim")),
     " is missing required fields: head_dim, aux_layers, block_size"),
    (json.dumps({**DRAFTER, "aux_layers": 3}), ": aux_layers must be a list, got 3"),
    (json.dumps({**DRAFTER, "aux_layers": "1,3"}), ": aux_layers must be a list, got '1,3'"),
]


@pytest.mark.parametrize("text, message", DRAFTER_REFUSED, ids=[str(i) for i in range(len(DRAFTER_REFUSED))])
def test_bad_drafter_config_json_is_refused_by_name(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelLoadError) as info:
        DrafterConfig.from_dir(tmp_path)
    assert str(info.value) == f"{tmp_path / 'config.json'}{message}"


def test_drafter_config_json_round_trips(tmp_path):
    cfg = DrafterConfig.from_dir(write_config(tmp_path, DRAFTER))
    assert cfg.aux_layers == (1, 3)
    assert DrafterConfig.from_dir(write_config(tmp_path / "again", cfg.to_json())) == cfg


def test_drafter_config_json_holds_exactly_the_config_s_fields(tmp_path):
    raw = DrafterConfig.from_dir(write_config(tmp_path, DRAFTER)).to_json()
    assert set(raw) == {"architectures", "model_type", *DrafterConfig.__dataclass_fields__}
    assert raw["aux_layers"] == [1, 3]  # a JSON list, as Hugging Face configs hold them


# ---- which file an error names -------------------------------------------------------------

TARGET = ModelConfig(**without(TINY, "architectures", "model_type") | dict(hidden_size=192, num_attention_heads=4,
                                                                          num_key_value_heads=2, num_hidden_layers=4))


def test_drafter_target_mismatch_names_the_drafter_s_config_json(tmp_path):
    write_config(tmp_path, {**DRAFTER, "aux_layers": [1, 4]})
    with pytest.raises(ModelLoadError) as info:
        load_drafter(tmp_path, TARGET)
    assert str(info.value) == (f"{tmp_path / 'config.json'}: aux_layers [4] are outside the target's "
                               "layers [0, 4)")


def test_drafter_weight_mismatch_names_the_drafter_s_weights_file(tmp_path):
    write_config(tmp_path, DRAFTER)
    save_file({"stray": torch.zeros(1)}, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(ModelLoadError) as info:
        load_drafter(tmp_path, TARGET)
    assert str(info.value).startswith(f"{tmp_path / WEIGHTS_FILE}: tensors do not match the config: missing ")
    assert str(info.value).endswith(", unexpected ['stray']")


def test_target_weight_mismatch_names_the_target_s_weights_file(tmp_path):
    write_config(tmp_path, TINY)
    save_file({"stray": torch.zeros(1)}, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(ModelLoadError) as info:
        load_model(tmp_path)
    assert str(info.value).startswith(f"{tmp_path / WEIGHTS_FILE}: tensors do not match the config: missing ")


def test_a_sharded_folder_s_mismatch_names_its_index(tmp_path, llama3_sharded_dir):
    folder = tmp_path / "sharded"
    shutil.copytree(llama3_sharded_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] - 1}))
    with pytest.raises(ModelLoadError) as info:
        load_model(folder)
    assert str(info.value).startswith(f"{folder / 'model.safetensors.index.json'}: tensors do not match the config: "
                                      "missing [], unexpected ['model.layers.")


def test_loaded_weights_are_frozen_parameters(target_dir):
    params = dict(load_model(target_dir).named_parameters())
    assert params and not any(p.requires_grad for p in params.values())


def linears(n):
    return torch.nn.Sequential(*(torch.nn.Linear(1, 1, bias=False) for _ in range(n)))


@pytest.mark.parametrize("num_params, state, message", [
    (5, {}, "missing ['0.weight', '1.weight', '2.weight', '3.weight', '4.weight'], unexpected []"),
    (6, {}, "missing ['0.weight', '1.weight', '2.weight', '3.weight', '4.weight']..., unexpected []"),
    (7, {}, "missing ['0.weight', '1.weight', '2.weight', '3.weight', '4.weight']..., unexpected []"),
    (1, {"0.weight": torch.zeros(1, 1), **{f"x{i}": torch.zeros(1) for i in range(6)}},
     "missing [], unexpected ['x0', 'x1', 'x2', 'x3', 'x4']"),
])
def test_weight_mismatch_lists_the_first_five_names(num_params, state, message):
    with pytest.raises(ModelLoadError) as info:
        load_weights(linears(num_params), state, "src")
    assert str(info.value) == f"src: tensors do not match the config: {message}"


# ---- where the loaded tensors live, and in which dtype -------------------------------------

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    save_model(LlamaForCausalLM(ModelConfig.from_dir(write_config(folder, TINY))), TINY, folder)
    return folder


@pytest.mark.parametrize("tied", [True, False])
def test_save_model_writes_a_hugging_face_folder_that_loads_back(tmp_path, tied):
    raw = {**TINY, "tie_word_embeddings": tied}
    torch.manual_seed(0)
    model = LlamaForCausalLM(ModelConfig.from_dir(write_config(tmp_path / "src", raw)))
    folder = tmp_path / "nested" / "out"  # save_model creates the parents
    save_model(model, raw, folder)
    assert (folder / "config.json").read_text() == json.dumps(raw, indent=2, sort_keys=True) + "\n"
    with safe_open(folder / WEIGHTS_FILE, "pt") as f:
        # transformers refuses a safetensors file without this metadata
        assert f.metadata() == {"format": "pt"}
        stored = set(f.keys())
    assert ("lm_head.weight" in stored) == (not tied)  # tied weights are stored once
    loaded = load_model(folder, device="cpu", dtype=torch.float32)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32), ("meta", torch.float32),
                                           ("meta", torch.bfloat16), ("cpu", torch.bfloat16)])
def test_load_model_puts_every_tensor_on_the_requested_device_and_dtype(tiny_dir, device, dtype):
    """Except the rotary frequencies, float32 whatever the dtype, as transformers keeps them
    (tests/engine/test_precision.py holds every tensor's dtype)."""
    model = load_model(tiny_dir, device=device, dtype=dtype)
    tensors = list(model.parameters()) + [b for n, b in model.named_buffers() if n != "rotary.inv_freq"]
    assert {(t.device.type, t.dtype) for t in tensors} == {(device, dtype)}
    assert (model.rotary.inv_freq.device.type, model.rotary.inv_freq.dtype) == (device, torch.float32)
    assert not model.training


def test_dense_forward_ignores_torch_s_default_device(tiny_dir):
    model = load_model(tiny_dir)
    ids = torch.tensor([[256, 104, 105, 10, 257]])
    logits, _ = model.forward_dense(ids)
    with torch.device("meta"):
        on_meta_default, _ = model.forward_dense(ids)
    assert on_meta_default.device.type == "cpu"
    torch.testing.assert_close(on_meta_default, logits, rtol=0, atol=0)


def tiny_drafter(block_size=4, **changes):
    torch.manual_seed(0)
    return DFlashDraftModel(DrafterConfig(**{**without(DRAFTER, "architectures", "model_type"),
                                             "aux_layers": (1, 3), "block_size": block_size, **changes}))


def engine_cfg(**kwargs):
    kwargs = dict(model="unused", spec="block", num_spec_tokens=4, max_model_len=32,
                  max_num_batched_tokens=64, max_num_seqs=2) | kwargs
    return EngineConfig(**kwargs)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_block_proposer_accepts_up_to_block_size_drafts(k):
    assert BlockProposer(tiny_drafter(block_size=4), None, engine_cfg(num_spec_tokens=k)).k == k


@pytest.mark.parametrize("k", [5, 16])
def test_block_proposer_refuses_more_drafts_than_its_block(k):
    with pytest.raises(SpecgateError) as info:
        BlockProposer(tiny_drafter(block_size=4), None, engine_cfg(num_spec_tokens=k))
    assert str(info.value) == (f"num_spec_tokens ({k}) exceeds the block drafter's block_size (4), "
                               "the most drafts it was trained to propose")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_block_proposer_state_has_the_engine_s_dtype_and_the_target_s_slots(dtype):
    cfg = engine_cfg(dtype=dtype, num_kv_blocks=7, block_size=8)
    proposer = BlockProposer(tiny_drafter(), None, cfg)
    torch_dtype = getattr(torch, dtype)
    assert {p.dtype for p in proposer.drafter.parameters()} == {torch_dtype}
    # One context K/V cache per drafter layer, addressed like the target's paged cache:
    # num_kv_blocks blocks plus the sink block that padding writes into.
    assert [(c.shape, c.dtype) for c in proposer.kv_caches] == [((2, 8 * 8, 2, 48), torch_dtype)]
    assert proposer.block_ids.tolist() == [259] * 5 and proposer.block_ids.dtype == torch.long
    assert proposer.offsets.tolist() == [0, 1, 2, 3, 4]


def test_drafter_reads_a_context_cache_of_another_dtype():
    """The context K/V are cast to the drafter's dtype: a float32 cache feeds a bfloat16 drafter."""
    model = tiny_drafter().to(torch.bfloat16)
    torch.manual_seed(1)
    embeds = torch.randn(2, 3, 192).bfloat16()
    positions = torch.tensor([[5, 6, 7], [2, 3, 4]])
    kv = [(torch.randn(2, 6, 2, 48).bfloat16(), torch.randn(2, 6, 2, 48).bfloat16())]
    mask = torch.arange(6) < torch.tensor([[5], [2]])
    expected = model(embeds, positions, kv, mask)
    got = model(embeds, positions, [(k.float(), v.float()) for k, v in kv], mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# ---- the drafter's target checksum ---------------------------------------------------------

def test_file_sha256_hashes_the_whole_file(tmp_path):
    for size in (0, 1, 70_001):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        (tmp_path / "f").write_bytes(data)
        assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def fixture_target(target_dir):
    return load_model(target_dir)


def drafter_copy(tmp_path, **changes):
    folder = tmp_path / "drafter"
    shutil.copytree(DRAFTER_DIR, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    return folder


def test_drafter_trained_against_this_target_loads_without_warning(target_dir, fixture_target):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BlockProposer.from_dir(DRAFTER_DIR, fixture_target, engine_cfg(model=str(target_dir)))


@pytest.mark.parametrize("case", ["no checksum", "no target weights"])
def test_drafter_without_a_checksum_to_compare_loads_without_warning(tmp_path, fixture_target, target_dir, case):
    if case == "no checksum":
        folder, model = drafter_copy(tmp_path, target_sha256=None), target_dir
    else:
        folder, model = drafter_copy(tmp_path, target_sha256="0" * 64), tmp_path / "no-weights-here"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BlockProposer.from_dir(folder, fixture_target, engine_cfg(model=str(model)))


def test_drafter_trained_against_another_target_warns_naming_the_checksum(tmp_path, fixture_target, target_dir):
    other = "0123456789abcdef" * 4
    folder = drafter_copy(tmp_path, target_sha256=other)
    with pytest.warns(UserWarning) as record:
        BlockProposer.from_dir(folder, fixture_target, engine_cfg(model=str(target_dir)))
    assert [str(w.message) for w in record] == [
        f"block drafter {folder} was trained against a different target (target_sha256 0123456789ab...); "
        "output stays exact, acceptance will be low"]
    # stacklevel=2: the warning points at whoever called from_dir, not at the engine's own line.
    assert not record[0].filename.endswith("block_drafter.py")


def test_measure_load_on_a_named_gpu_reports_that_gpu_s_peak_during_the_load_in_mib(monkeypatch):
    """On cuda:1 the figures must be cuda:1's, not the current device's: its peak reset before the
    load, its queued work waited for before the clock stops, and its peak bytes reported in MiB.
    torch.cuda is recorded (this machine has no GPU); the load is a 2 MiB model on the meta device."""
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: calls.append(("synchronize", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: calls.append(("peak", device)) or 5 * 2**20)

    def load(model_dir, device, dtype):
        calls.append(("load", device))
        return torch.nn.Linear(512, 1024, bias=False, device="meta")
    monkeypatch.setattr(load_cost, "load_model", load)
    m, _ = measure_load("unused", "cuda:1")
    assert calls == [("reset", "cuda:1"), ("load", "cuda:1"), ("synchronize", "cuda:1"), ("peak", "cuda:1")]
    assert (m.weights_mib, m.device_peak_mib) == (2.0, 5.0)


def test_measure_load_reports_time_weights_and_peak_host_memory_of_a_sharded_folder(llama3_sharded_dir, tmp_path,
                                                                                      cli_env):
    """`specgate bench --measure-load` in a fresh process, as the lead runs it for the 1B shape."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from engine.bench.load_cost import measure_load
    from engine.loader import load_model
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, "-m", "specgate_cli", "bench", "--model", str(llama3_sharded_dir),
                           "--measure-load", "--json", str(out)], cwd=repo, capture_output=True, text=True,
                          env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "peak host memory" in proc.stdout
    load = json.loads(out.read_text())["load"]
    model = load_model(llama3_sharded_dir)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    assert load["weights_mib"] == pytest.approx(weights, abs=1e-3)
    assert load["seconds"] > 0 and load["peak_rss_mib"] >= load["peak_rss_mib_before"] > 0
    assert load["device_peak_mib"] is None
    m, _ = measure_load(llama3_sharded_dir)  # in-process: the same weights, a high-water mark that only grows
    assert m.weights_mib == pytest.approx(weights) and m.peak_rss_mib >= m.peak_rss_mib_before
