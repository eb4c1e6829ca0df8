"""Every key a Hugging Face Llama config.json or generation_config.json may hold, classified.

A key is HONOURED (the engine computes what transformers computes with it), INERT (it cannot
change a generated token: training-only, bookkeeping, or a feature of other model classes whose
value here is its neutral default), or REFUSED (a feature the engine does not implement; its
neutral values are accepted, anything else is an error naming the key). A key in no table is
refused: an unknown key could change the computation, so it is never ignored silently.
"""
from dataclasses import dataclass

HONOURED, INERT, REFUSED = "honoured", "inert", "refused"


@dataclass(frozen=True)
class Key:
    kind: str
    why: str
    neutral: tuple = ()  # for INERT and REFUSED keys: the values that switch the feature off


def _inert(why: str, *neutral) -> Key:
    return Key(INERT, why, neutral)


def _refused(why: str, *neutral) -> Key:
    return Key(REFUSED, why, neutral)


def _honoured(why: str) -> Key:
    return Key(HONOURED, why)


ANY = object()  # an INERT key whose every value is harmless

LLAMA_CONFIG_KEYS: dict[str, Key] = {
    # -- the architecture's sizes and numerics
    "vocab_size": _honoured("embedding and head rows"),
    "hidden_size": _honoured("model width"),
    "intermediate_size": _honoured("MLP width"),
    "num_hidden_layers": _honoured("decoder layers"),
    "num_attention_heads": _honoured("query heads"),
    "num_key_value_heads": _honoured("key/value heads (GQA, MQA); default num_attention_heads"),
    "head_dim": _honoured("per-head width; default hidden_size // num_attention_heads"),
    "hidden_act": _honoured("the MLP's activation (engine.model.ACTIVATIONS)"),
    "max_position_embeddings": _honoured("bounds max_model_len; llama3 rope's default original length"),
    "rms_norm_eps": _honoured("RMSNorm epsilon; default 1e-6 as transformers' LlamaConfig"),
    "rope_theta": _honoured("rope base (transformers 4 spelling)"),
    "rope_scaling": _honoured("rope type and parameters (transformers 4 spelling), engine.rope"),
    "rope_parameters": _honoured("rope base, type and parameters (transformers 5 spelling), engine.rope"),
    "original_max_position_embeddings": _honoured("llama3 rope: overrides the rope dict's, as transformers"),
    "partial_rotary_factor": _refused("only a full rotary head is implemented", None, 1, 1.0),
    "tie_word_embeddings": _honoured("head shares the embedding; a distinct stored head is refused"),
    "bos_token_id": _honoured("the byte tokenizer's BOS check; tokenizers from the folder use their own"),
    "eos_token_id": _honoured("every listed id ends a request unless ignore_eos; absent: 2, as "
                              "transformers' LlamaConfig (null: none)"),
    "dtype": _honoured("the engine's dtype when the user gives none (transformers 5 spelling)"),
    "torch_dtype": _honoured("the engine's dtype when the user gives none (transformers 4 spelling)"),
    "model_type": _honoured("must be 'llama'"),
    "architectures": _honoured("must include LlamaForCausalLM"),
    # -- features of the Llama class the engine does not implement
    "attention_bias": _refused("biases on q/k/v/o projections", False, None),
    "mlp_bias": _refused("biases on the MLP projections", False, None),
    "quantization_config": _refused("quantised weights", None),
    "auto_map": _refused("custom modelling code", None),
    "pruned_heads": _refused("pruned attention heads", None, {}),
    "add_cross_attention": _refused("cross-attention layers", False, None),
    "is_encoder_decoder": _refused("encoder-decoder models", False, None),
    "tie_encoder_decoder": _refused("encoder-decoder models", False, None),
    "layer_types": _refused("per-layer attention types", None),
    "sliding_window": _refused("sliding-window attention", None),
    # -- no effect on generated tokens
    "attention_dropout": _inert("dropout is off at inference", ANY),
    "initializer_range": _inert("random initialisation only; weights come from the file", ANY),
    "pretraining_tp": _inert("transformers 5 ignores it; the split matmuls it named are the same product", ANY),
    "use_cache": _inert("the engine always uses its paged KV cache", ANY),
    "pad_token_id": _inert("the engine never pads a request's tokens", ANY),
    "sep_token_id": _inert("not used by causal generation", ANY),
    "decoder_start_token_id": _inert("encoder-decoder only", None),
    "transformers_version": _inert("bookkeeping", ANY),
    "_name_or_path": _inert("bookkeeping", ANY),
    "_attn_implementation_autoset": _inert("bookkeeping", ANY),
    "output_hidden_states": _inert("what transformers returns besides logits", ANY),
    "output_attentions": _inert("what transformers returns besides logits", ANY),
    "return_dict": _inert("what transformers returns besides logits", ANY),
    "torchscript": _inert("export setting", ANY),
    "use_bfloat16": _inert("TensorFlow/Flax training setting", ANY),
    "tf_legacy_loss": _inert("training only", ANY),
    "chunk_size_feed_forward": _inert("not used by LlamaForCausalLM", ANY),
    "problem_type": _inert("sequence-classification heads only", ANY),
    "id2label": _inert("sequence-classification heads only", ANY),
    "label2id": _inert("sequence-classification heads only", ANY),
    "num_labels": _inert("sequence-classification heads only", ANY),
    "finetuning_task": _inert("bookkeeping", ANY),
    "task_specific_params": _inert("pipeline presets, not read by generate", ANY),
    "prefix": _inert("pipeline preset, not read by generate", ANY),
    "tokenizer_class": _inert("the tokenizer is read from tokenizer.json / tokenizer_config.json", ANY),
    "is_decoder": _inert("a causal LM is a decoder either way", ANY),
    "cross_attention_hidden_size": _inert("encoder-decoder only", None),
}

GENERATION_CONFIG_KEYS: dict[str, Key] = {
    "eos_token_id": _honoured("replaces config.json's eos ids, as in transformers; every id stops"),
    "bos_token_id": _inert("generation starts from the encoded prompt", ANY),
    "pad_token_id": _inert("the engine never pads a request's tokens", ANY),
    "do_sample": _honoured("false: the default SamplingParams are greedy"),
    "temperature": _honoured("default SamplingParams.temperature when do_sample"),
    "top_k": _honoured("default SamplingParams.top_k when do_sample"),
    "top_p": _honoured("default SamplingParams.top_p when do_sample"),
    "max_new_tokens": _honoured("default SamplingParams.max_tokens"),
    "max_length": _inert("the engine bounds length by max_model_len and max_tokens", ANY),
    "transformers_version": _inert("bookkeeping", ANY),
    "_from_model_config": _inert("bookkeeping", ANY),
    "use_cache": _inert("the engine always uses its paged KV cache", ANY),
    "output_attentions": _inert("what transformers returns besides tokens", ANY),
    "output_hidden_states": _inert("what transformers returns besides tokens", ANY),
    "output_scores": _inert("what transformers returns besides tokens", ANY),
    "output_logits": _inert("what transformers returns besides tokens", ANY),
    "return_dict_in_generate": _inert("what transformers returns besides tokens", ANY),
    "num_beams": _refused("beam search", None, 1),
    "num_return_sequences": _refused("several sequences per prompt", None, 1),
    "repetition_penalty": _refused("repetition penalty", None, 1, 1.0),
    "min_p": _refused("min-p sampling", None, 0, 0.0),
    "typical_p": _refused("typical sampling", None, 1, 1.0),
    "min_length": _refused("a minimum length", None, 0),
    "min_new_tokens": _refused("a minimum length", None, 0),
    "no_repeat_ngram_size": _refused("n-gram blocking", None, 0),
    "length_penalty": _inert("beam search only, and num_beams is refused above 1", ANY),
    "early_stopping": _inert("beam search only, and num_beams is refused above 1", ANY),
}


def check_keys(raw: dict, table: dict[str, Key], where: str) -> None:
    """Raise ValueError naming the first key that is unknown, or refused with a non-neutral value."""
    for name, value in raw.items():
        rule = table.get(name)
        if rule is None:
            raise ValueError(f"{where}: unknown key {name}={value!r}: specgate refuses keys it does not "
                             f"know, as they could change the computation (engine/hf_config.py lists "
                             f"the known ones)")
        if rule.kind == REFUSED and not _is_neutral(value, rule.neutral):
            raise ValueError(f"{where}: {name}={value!r} is not supported ({rule.why})")
        if rule.kind == INERT and ANY not in rule.neutral and not _is_neutral(value, rule.neutral):
            raise ValueError(f"{where}: {name}={value!r} is not supported ({rule.why})")


def _is_neutral(value, neutral: tuple) -> bool:
    return any(value == n and type(value) is not bool or value is n for n in neutral)
