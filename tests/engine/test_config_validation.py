"""Configuration is validated at its exact boundaries: the last accepted value is accepted, the
first refused one is refused with a message that names the field, its range and the value.

Pure unit tests of EngineConfig, ModelConfig, DrafterConfig, the byte tokenizer's decode and the
async-runner veto: no model is loaded."""
import logging

import pytest

from engine.block_drafter import DrafterConfig
from engine.config import EngineConfig, ModelConfig
from engine.errors import ModelLoadError, SpecgateError
from engine.tokenizer import ByteTokenizer
from engine.veto import ENV_VAR, evidence_refusal, use_async_runner

# ---- EngineConfig --------------------------------------------------------------------------

def engine(**kwargs):
    return EngineConfig(model="unused", **kwargs)


# (field, lo, hi, keyword arguments that make every other check pass at either end)
INTEGER_RANGES = [
    ("max_num_seqs", 1, 256, {}),
    ("max_model_len", 2, 65536, dict(max_num_batched_tokens=1 << 20)),
    ("block_size", 1, 1024, {}),
    ("max_num_batched_tokens", 1, 1048576, dict(max_model_len=2)),
    ("num_spec_tokens", 1, 16, dict(spec="ngram")),
]


@pytest.mark.parametrize("name, lo, hi, extra", INTEGER_RANGES, ids=[r[0] for r in INTEGER_RANGES])
def test_integer_fields_accept_both_ends_of_their_range(name, lo, hi, extra):
    # max_num_batched_tokens=1 is in range but can never prefill a prompt (see below).
    for value in (max(lo, 2) if name == "max_num_batched_tokens" else lo, hi):
        assert getattr(engine(**{name: value, **extra}), name) == value


@pytest.mark.parametrize("name, lo, hi, extra", INTEGER_RANGES, ids=[r[0] for r in INTEGER_RANGES])
def test_integer_fields_refuse_values_just_outside_their_range(name, lo, hi, extra):
    for value in (lo - 1, hi + 1, float(lo), str(lo), None):
        with pytest.raises(SpecgateError) as info:
            engine(**{name: value, **extra})
        assert str(info.value) == f"{name} must be an integer in [{lo}, {hi}], got {value!r}"


def test_one_batched_token_is_refused_for_the_prompt_length_not_the_range():
    """1 is inside max_num_batched_tokens' own range; what it cannot do is prefill a prompt."""
    with pytest.raises(SpecgateError, match=r"^max_num_batched_tokens \(1\) must be at least "
                                            r"max_model_len \(2\) so every prompt"):
        engine(max_num_batched_tokens=1, max_model_len=2)


@pytest.mark.parametrize("k", [1, 8, 16])
def test_a_verify_step_of_k_drafts_needs_k_plus_1_batched_tokens(k):
    ok = engine(spec="ngram", num_spec_tokens=k, max_model_len=2, max_num_batched_tokens=k + 1)
    assert ok.k == k
    if k + 1 > 2:
        with pytest.raises(SpecgateError, match=rf"^max_num_batched_tokens \({k}\) must be at least "
                                                rf"num_spec_tokens \+ 1 \({k + 1}\) so a verify step fits$"):
            engine(spec="ngram", num_spec_tokens=k, max_model_len=2, max_num_batched_tokens=k)


def test_num_spec_tokens_is_ignored_without_spec():
    assert engine(num_spec_tokens=16, max_model_len=2, max_num_batched_tokens=2).k == 0


@pytest.mark.parametrize("seed", [0, 1, (1 << 64) - 1])
def test_seed_accepts_every_64_bit_value(seed):
    assert engine(seed=seed).seed == seed


@pytest.mark.parametrize("seed", [-1, 1 << 64, (2 << 64) - 1, 1 << 65, True, 1.0, "0"])
def test_seed_must_fit_in_64_bits(seed):
    with pytest.raises(SpecgateError, match=rf"^seed must be an integer in \[0, 2\*\*64\), got {seed!r}$"):
        engine(seed=seed)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:3"])
def test_cpu_and_cuda_devices_are_accepted(device):
    """Whether a CUDA device exists is the engine's check (test_errors), not the config's."""
    assert engine(device=device).device == device


@pytest.mark.parametrize("device", ["CUDA", "gpu", "mps", "meta", "", None])
def test_other_devices_are_refused(device):
    with pytest.raises(SpecgateError, match=rf"^device must be 'cpu' or 'cuda\[:N\]', got {device!r}$"):
        engine(device=device)


@pytest.mark.parametrize("value", [1, 0, "yes", "auto"])
def test_compile_must_be_a_bool_or_none(value):
    """A truthy non-bool would silently pick a forward; it is refused instead (how None is resolved:
    test_compile_default.py)."""
    with pytest.raises(SpecgateError, match=rf"^compile must be True, False or None \(None: compiled on CUDA, "
                                            rf"the reference forward on the CPU\), got {value!r}$"):
        engine(compile=value)


# ---- ModelConfig ---------------------------------------------------------------------------

BASE_MODEL = dict(vocab_size=260, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
POSITIVE = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings"]
# Setting one field to 1 may need another field changed to keep the config consistent.
AT_ONE = {"hidden_size": dict(head_dim=4), "num_attention_heads": dict(num_key_value_heads=1)}


@pytest.mark.parametrize("name", POSITIVE)
def test_model_sizes_accept_one(name):
    assert getattr(ModelConfig(**{**BASE_MODEL, **AT_ONE.get(name, {}), name: 1}), name) == 1


@pytest.mark.parametrize("name", POSITIVE)
@pytest.mark.parametrize("value", [0, -1, 2.0, "8"])
def test_model_sizes_must_be_positive_integers(name, value):
    with pytest.raises(ModelLoadError, match=rf"^config\.json: {name} must be a positive integer, "
                                             rf"got {value!r}$"):
        ModelConfig(**{**BASE_MODEL, name: value})


@pytest.mark.parametrize("name", ["bos_token_id", "eos_token_id"])
@pytest.mark.parametrize("value", [None, 0, 1, 259])
def test_special_token_ids_accept_every_id_in_the_vocabulary(name, value):
    assert getattr(ModelConfig(**BASE_MODEL, **{name: value}), name) == value


@pytest.mark.parametrize("name", ["bos_token_id", "eos_token_id"])
@pytest.mark.parametrize("value", [-1, 260, 261, True, False, 5.0, "5"])
def test_special_token_ids_outside_the_vocabulary_are_refused(name, value):
    with pytest.raises(ModelLoadError, match=rf"^config\.json: {name} must be a token id in \[0, 260\) "
                                             rf"\(vocab_size\), got {value!r}$"):
        ModelConfig(**BASE_MODEL, **{name: value})


# ---- DrafterConfig -------------------------------------------------------------------------

BASE_DRAFTER = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=4, vocab_size=260, aux_layers=(1,), block_size=2)
TARGET = ModelConfig(**{**BASE_MODEL, "num_hidden_layers": 4})


def drafter(**changes):
    return DrafterConfig(**{**BASE_DRAFTER, **changes})


@pytest.mark.parametrize("aux_layers", [(), (1, "2"), (1.0,), (None,)])
def test_drafter_aux_layers_must_be_a_non_empty_list_of_integers(aux_layers):
    with pytest.raises(ModelLoadError) as info:
        drafter(aux_layers=aux_layers)
    assert str(info.value) == ("drafter config.json: aux_layers must be a non-empty list of target layer "
                               f"indices, got {aux_layers!r}")


@pytest.mark.parametrize("block_size", [1, 2, 16])
def test_drafter_block_size_accepts_any_positive_integer(block_size):
    assert drafter(block_size=block_size).block_size == block_size


@pytest.mark.parametrize("block_size", [0, -1, 2.0, "4", None])
def test_drafter_block_size_must_be_a_positive_integer(block_size):
    with pytest.raises(ModelLoadError, match=rf"^drafter config\.json: block_size must be a positive "
                                             rf"integer, got {block_size!r}$"):
        drafter(block_size=block_size)


def test_drafter_layers_are_llama_layers_with_the_drafter_s_own_shape():
    """head_dim and rope_theta are the drafter's, even where they differ from the defaults."""
    cfg = drafter(head_dim=6, rope_theta=500000.0, rms_norm_eps=1e-6, max_position_embeddings=77)
    assert cfg.layer_config() == ModelConfig(260, 8, 16, 1, 2, 1, 77, 1e-6, 500000.0, head_dim=6)
    assert cfg.layer_config().dim_per_head == 6


@pytest.mark.parametrize("aux_layers", [(0,), (3,), (0, 1, 2, 3), (0, 3)])
def test_aux_layers_may_be_any_target_layer(aux_layers):
    drafter(aux_layers=aux_layers).check_target(TARGET, "d.json")


@pytest.mark.parametrize("aux_layers, bad", [((4,), [4]), ((-1, 0), [-1]), ((0, 4, 5), [4, 5])])
def test_aux_layers_outside_the_target_are_refused(aux_layers, bad):
    with pytest.raises(ModelLoadError) as info:
        drafter(aux_layers=aux_layers).check_target(TARGET, "d.json")
    assert str(info.value) == f"d.json: aux_layers {bad} are outside the target's layers [0, 4)"


@pytest.mark.parametrize("aux_layers", [(2, 1), (1, 1), (0, 2, 2, 3)])
def test_aux_layers_must_be_increasing_and_distinct(aux_layers):
    with pytest.raises(ModelLoadError) as info:
        drafter(aux_layers=aux_layers).check_target(TARGET, "d.json")
    assert str(info.value) == f"d.json: aux_layers must be increasing and distinct, got {list(aux_layers)}"


@pytest.mark.parametrize("mask_token_id", [0, 1, 259])
def test_mask_token_may_be_any_target_token(mask_token_id):
    drafter(mask_token_id=mask_token_id).check_target(TARGET, "d.json")


@pytest.mark.parametrize("mask_token_id", [-1, 260, 261])
def test_mask_token_outside_the_target_vocabulary_is_refused(mask_token_id):
    with pytest.raises(ModelLoadError) as info:
        drafter(mask_token_id=mask_token_id).check_target(TARGET, "d.json")
    assert str(info.value) == f"d.json: mask_token_id {mask_token_id} is outside the vocabulary [0, 260)"


@pytest.mark.parametrize("name, value", [("hidden_size", 16), ("vocab_size", 300)])
def test_drafter_must_share_the_target_s_width_and_vocabulary(name, value):
    cfg = drafter(**{name: value})
    with pytest.raises(ModelLoadError) as info:
        cfg.check_target(TARGET, "d.json")
    assert str(info.value) == f"d.json: drafter {name} {value} does not match the target's {getattr(TARGET, name)}"


# ---- the byte tokenizer's decode -----------------------------------------------------------

@pytest.mark.parametrize("ids, text", [
    ([0], "\x00"), ([0, 104, 0], "\x00h\x00"), ([255], "\ufffd"), ([0xC3], "\ufffd"),
    ([0xC3, 0xA9], "\u00e9"), ([104, 0xFF, 105], "h\ufffdi"), ([-1, 256, 259, 260, 104], "h"),
])
def test_decode_keeps_every_byte_and_replaces_broken_utf8(ids, text):
    assert ByteTokenizer().decode(ids) == text


# ---- the async-runner veto -----------------------------------------------------------------

VETO = [  # (VT_ASYNC_RUNNER, spec, async_runner=, runs async)
    (None, None, None, True), ("", None, None, True), (None, "ngram", None, False),
    ("", "block", None, False), (None, "ngram", True, True), (None, None, False, False),
    ("1", "ngram", None, True), ("1", None, False, True), ("0", None, True, False),
    ("0", "ngram", None, False), ("", "ngram", True, True),
]


@pytest.mark.parametrize("env, spec, requested, expected", VETO)
def test_veto_decides_the_runner(monkeypatch, env, spec, requested, expected):
    if env is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, env)
    assert use_async_runner(spec, requested, "cpu") is expected


@pytest.mark.parametrize("env", ["2", "yes", "true", " 1", "00"])
def test_veto_environment_variable_must_be_0_or_1(monkeypatch, env):
    monkeypatch.setenv(ENV_VAR, env)
    with pytest.raises(SpecgateError, match=rf"^VT_ASYNC_RUNNER must be 0 or 1, got {env!r}$"):
        use_async_runner(None, None, "cpu")


@pytest.mark.parametrize("spec", ["ngram", "block"])
def test_veto_warning_says_how_to_lift_it(monkeypatch, caplog, spec):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with caplog.at_level(logging.WARNING, logger="specgate"):
        assert use_async_runner(spec, None, "cpu") is False  # on the CPU: no evidence covers a CPU run
    assert [r.getMessage() for r in caplog.records] == [
        f"async runner vetoed for speculative decoding (spec={spec}): {evidence_refusal('cpu', False, False)}; using "
        "the sync runner (--async-runner, VT_ASYNC_RUNNER=1 or async_runner=True lifts it for a run)"]



SMALLEST_LLAMA = dict(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=256)


@pytest.mark.parametrize("change, message", [
    (dict(hidden_size=None), "model/config.json is missing required fields: hidden_size"),
    (dict(eos_token_id=[]), "model/config.json: eos_token_id is an empty list"),
    (dict(eos_token_id=[1, 999]),
     "model/config.json: eos_token_id must be a token id in [0, 260) (vocab_size), got 999"),
    (dict(rms_norm_eps="1e-5"), "model/config.json: rms_norm_eps must be a number in (0, 1), got '1e-5'"),
    (dict(rms_norm_eps=0), "model/config.json: rms_norm_eps must be a number in (0, 1), got 0"),
    (dict(rms_norm_eps=1.0), "model/config.json: rms_norm_eps must be a number in (0, 1), got 1.0"),
    (dict(torch_dtype="int8"),
     "model/config.json: dtype 'int8' is not supported (supported: float32, bfloat16, float16)"),
    # the file is named once, in front: a value that spells config.json is quoted as given
    (dict(hidden_act="config.json"),
     "model/config.json: hidden_act='config.json' is not supported (transformers does not know it either); "
     "supported: gelu, gelu_fast, gelu_new, gelu_pytorch_tanh, quick_gelu, relu, relu2, relu6, sigmoid, silu, "
     "swish, tanh"),
], ids=["missing-field", "empty-eos-list", "eos-outside-vocab", "eps-string", "eps-zero", "eps-one", "dtype-int8",
        "value-spelling-the-file"])
def test_a_config_json_it_cannot_read_is_refused_naming_its_file(change, message):
    ModelConfig.from_dict(SMALLEST_LLAMA, "model/config.json")
    raw = {k: v for k, v in {**SMALLEST_LLAMA, **change}.items() if v is not None}
    with pytest.raises(ModelLoadError) as refused:
        ModelConfig.from_dict(raw, "model/config.json")
    assert str(refused.value) == message


def test_config_json_is_the_default_name_and_a_torch_prefixed_dtype_is_read_as_transformers_writes_it():
    with pytest.raises(ModelLoadError) as refused:
        ModelConfig.from_dict({**SMALLEST_LLAMA, "eos_token_id": []})
    assert str(refused.value) == "config.json: eos_token_id is an empty list"
    assert ModelConfig.from_dict({**SMALLEST_LLAMA, "torch_dtype": "torch.bfloat16"}).dtype == "bfloat16"

