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


ANY = object()  # an INERT key whose every value is harmless

LLAMA_CONFIG_KEYS: dict[str, Key] = {
    # -- the architecture's sizes and numerics
    "vocab_size": Key(HONOURED, "embedding and head rows"),
    "hidden_size": Key(HONOURED, "model width"),
    "intermediate_size": Key(HONOURED, "MLP width"),
    "num_hidden_layers": Key(HONOURED, "decoder layers"),
    "num_attention_heads": Key(HONOURED, "query heads"),
    "num_key_value_heads": Key(HONOURED, "key/value heads (GQA, MQA); default num_attention_heads"),
    "head_dim": Key(HONOURED, "per-head width; default hidden_size // num_attention_heads"),
    "hidden_act": Key(HONOURED, "the MLP's activation (engine.activations)"),
    "max_position_embeddings": Key(HONOURED, "bounds max_model_len; llama3 rope's default original length"),
    "rms_norm_eps": Key(HONOURED, "RMSNorm epsilon; default 1e-6 as transformers' LlamaConfig"),
    "rope_theta": Key(HONOURED, "rope base (transformers 4 spelling)"),
    "rope_scaling": Key(HONOURED, "rope type and parameters (transformers 4 spelling), engine.rope"),
    "rope_parameters": Key(HONOURED, "rope base, type and parameters (transformers 5 spelling), engine.rope"),
    "original_max_position_embeddings": Key(HONOURED, "llama3 rope: overrides the rope dict's, as transformers"),
    "partial_rotary_factor": Key(REFUSED, "only a full rotary head is implemented", (None, 1, 1.0)),
    "tie_word_embeddings": Key(HONOURED, "head shares the embedding; a distinct stored head is refused"),
    "bos_token_id": Key(HONOURED, "the byte tokenizer's BOS check; tokenizers from the folder use their own"),
    "eos_token_id": Key(HONOURED, "every listed id ends a request unless ignore_eos; absent: 2, as "
                              "transformers' LlamaConfig (null: none)"),
    "dtype": Key(HONOURED, "the engine's dtype when the user gives none (transformers 5 spelling)"),
    "torch_dtype": Key(HONOURED, "the engine's dtype when the user gives none (transformers 4 spelling)"),
    "model_type": Key(HONOURED, "must be 'llama'"),
    "architectures": Key(HONOURED, "must include LlamaForCausalLM"),
    # -- features of the Llama class the engine does not implement
    "attention_bias": Key(REFUSED, "biases on q/k/v/o projections", (False, None)),
    "mlp_bias": Key(REFUSED, "biases on the MLP projections", (False, None)),
    "quantization_config": Key(REFUSED, "quantised weights", (None,)),
    "auto_map": Key(REFUSED, "custom modelling code", (None,)),
    "pruned_heads": Key(REFUSED, "pruned attention heads", (None, {})),
    "add_cross_attention": Key(REFUSED, "cross-attention layers", (False, None)),
    "is_encoder_decoder": Key(REFUSED, "encoder-decoder models", (False, None)),
    "tie_encoder_decoder": Key(REFUSED, "encoder-decoder models", (False, None)),
    "layer_types": Key(REFUSED, "per-layer attention types", (None,)),
    "sliding_window": Key(REFUSED, "sliding-window attention", (None,)),
    # -- no effect on generated tokens
    "attention_dropout": Key(INERT, "dropout is off at inference", (ANY,)),
    "initializer_range": Key(INERT, "random initialisation only; weights come from the file", (ANY,)),
    "pretraining_tp": Key(INERT, "transformers 5 ignores it; the split matmuls it named are the same product", (ANY,)),
    "use_cache": Key(INERT, "the engine always uses its paged KV cache", (ANY,)),
    "pad_token_id": Key(INERT, "the engine never pads a request's tokens", (ANY,)),
    "sep_token_id": Key(INERT, "not used by causal generation", (ANY,)),
    "decoder_start_token_id": Key(INERT, "encoder-decoder only", (None,)),
    "transformers_version": Key(INERT, "bookkeeping", (ANY,)),
    "_name_or_path": Key(INERT, "bookkeeping", (ANY,)),
    "_attn_implementation_autoset": Key(INERT, "bookkeeping", (ANY,)),
    "output_hidden_states": Key(INERT, "what transformers returns besides logits", (ANY,)),
    "output_attentions": Key(INERT, "what transformers returns besides logits", (ANY,)),
    "return_dict": Key(INERT, "what transformers returns besides logits", (ANY,)),
    "torchscript": Key(INERT, "export setting", (ANY,)),
    "use_bfloat16": Key(INERT, "TensorFlow/Flax training setting", (ANY,)),
    "tf_legacy_loss": Key(INERT, "training only", (ANY,)),
    "chunk_size_feed_forward": Key(INERT, "not used by LlamaForCausalLM", (ANY,)),
    "problem_type": Key(INERT, "sequence-classification heads only", (ANY,)),
    "id2label": Key(INERT, "sequence-classification heads only", (ANY,)),
    "label2id": Key(INERT, "sequence-classification heads only", (ANY,)),
    "num_labels": Key(INERT, "sequence-classification heads only", (ANY,)),
    "finetuning_task": Key(INERT, "bookkeeping", (ANY,)),
    "task_specific_params": Key(INERT, "pipeline presets, not read by generate", (ANY,)),
    "prefix": Key(INERT, "pipeline preset, not read by generate", (ANY,)),
    "tokenizer_class": Key(INERT, "the tokenizer is read from tokenizer.json / tokenizer_config.json", (ANY,)),
    "is_decoder": Key(INERT, "a causal LM is a decoder either way", (ANY,)),
    "cross_attention_hidden_size": Key(INERT, "encoder-decoder only", (None,)),
}

GENERATION_CONFIG_KEYS: dict[str, Key] = {
    "eos_token_id": Key(HONOURED, "replaces config.json's eos ids, as in transformers; every id stops; "
                              "absent or null: none"),
    "bos_token_id": Key(INERT, "generation starts from the encoded prompt", (ANY,)),
    "pad_token_id": Key(INERT, "the engine never pads a request's tokens", (ANY,)),
    "do_sample": Key(HONOURED, "false: the default SamplingParams are greedy"),
    "temperature": Key(HONOURED, "default SamplingParams.temperature when do_sample"),
    "top_k": Key(HONOURED, "default SamplingParams.top_k when do_sample"),
    "top_p": Key(HONOURED, "default SamplingParams.top_p when do_sample"),
    "max_new_tokens": Key(HONOURED, "default SamplingParams.max_tokens"),
    "max_length": Key(HONOURED, "prompt + new tokens of a request without SamplingParams, unless "
                            "max_new_tokens is given (transformers' generate)"),
    "transformers_version": Key(INERT, "bookkeeping", (ANY,)),
    "_from_model_config": Key(INERT, "bookkeeping", (ANY,)),
    "use_cache": Key(INERT, "the engine always uses its paged KV cache", (ANY,)),
    "output_attentions": Key(INERT, "what transformers returns besides tokens", (ANY,)),
    "output_hidden_states": Key(INERT, "what transformers returns besides tokens", (ANY,)),
    "output_scores": Key(INERT, "what transformers returns besides tokens", (ANY,)),
    "output_logits": Key(INERT, "what transformers returns besides tokens", (ANY,)),
    "return_dict_in_generate": Key(INERT, "what transformers returns besides tokens", (ANY,)),
    "num_beams": Key(REFUSED, "beam search", (None, 1)),
    "num_return_sequences": Key(REFUSED, "several sequences per prompt", (None, 1)),
    "repetition_penalty": Key(REFUSED, "repetition penalty", (None, 1, 1.0)),
    "min_p": Key(REFUSED, "min-p sampling", (None, 0, 0.0)),
    "typical_p": Key(REFUSED, "typical sampling", (None, 1, 1.0)),
    "min_length": Key(REFUSED, "a minimum length", (None, 0)),
    "min_new_tokens": Key(REFUSED, "a minimum length", (None, 0)),
    "no_repeat_ngram_size": Key(REFUSED, "n-gram blocking", (None, 0)),
    "length_penalty": Key(INERT, "beam search only, and num_beams is refused above 1", (ANY,)),
    "early_stopping": Key(INERT, "beam search only, and num_beams is refused above 1", (ANY,)),
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
