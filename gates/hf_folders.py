"""Small Hugging Face Llama folders in the layouts published checkpoints ship, built here with
transformers (LlamaConfig + save_pretrained) and the `tokenizers` library: nothing downloaded.
The oracle gate runs the engine and transformers on them; tests use them too.

Tokenizer layouts (TOKENIZER_LAYOUTS): Llama 3's byte-level BPE with its post-processor adding
<|begin_of_text|>, also with truncation and padding sections; Llama 2's as published (a
Prepend+Replace normalizer, byte fallback, tokenizer_class LlamaTokenizer, `legacy` false) and its
variants `legacy` true, no `legacy` key and `add_prefix_space` false; each with an added
(non-special) token.
"""
import json
import sysconfig
from pathlib import Path

import torch

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"]
LLAMA2_SPECIALS = ["<unk>", "<s>", "</s>"]
ADDED = "<|tool|>"  # an added token that is not special: decode keeps it
# Spaces (leading, doubled, trailing), newlines and tabs, specials inside and right before text,
# an added token, non-ASCII, a rendered Llama 2 chat prompt and a Llama 3 one.
TEXTS = ("Hello world", " leading space", "double  space and trailing ", "two\nlines\n\n\tand a tab",
         "<s>after bos</s> after eos", "<|begin_of_text|>x <|eot_id|>\ny", f"call {ADDED} now{ADDED}",
         "é→🐍 naïve", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]", "",
         "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>")
# layout -> tokenizer_config.json keys beside the base layout's (llama3 or llama2, the name's start)
TOKENIZER_LAYOUTS = {
    "llama3": {},
    "llama3-truncation-padding": {},  # tokenizer.json with truncation and padding sections, as some repos ship
    "llama2": {"legacy": False},
    "llama2-legacy": {"legacy": True},
    "llama2-no-legacy-key": {},       # transformers' default: legacy false
    "llama2-no-prefix-space": {"legacy": False, "add_prefix_space": False},
}


def _training_text() -> list[str]:
    return [(Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()]


def write_tokenizer(folder: Path, layout: str, vocab_size: int = 400) -> Path:
    """tokenizer.json and tokenizer_config.json of `layout` (TOKENIZER_LAYOUTS) into `folder`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    folder.mkdir(parents=True, exist_ok=True)
    if layout.startswith("llama3"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=LLAMA3_SPECIALS, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(_training_text(), trainer)
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{LLAMA3_SPECIALS[0]}:0 $A:0",
                                          special_tokens=[(LLAMA3_SPECIALS[0], 0)])])
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": LLAMA3_SPECIALS[0],
                  "eos_token": LLAMA3_SPECIALS[1]}
    else:
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=LLAMA2_SPECIALS, show_progress=False)
        tok.train_from_iterator(_training_text(), trainer)
        tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", special_tokens=[("<s>", 1)])
        # As in Llama 2, the 256 byte tokens follow the three specials, so no text is unknown.
        raw = json.loads(tok.to_str())
        learned = [t for t, _ in sorted(raw["model"]["vocab"].items(), key=lambda kv: kv[1])
                   if t not in LLAMA2_SPECIALS]
        vocab = [*LLAMA2_SPECIALS, *(f"<0x{i:02X}>" for i in range(256)), *learned]
        raw["model"]["vocab"] = {t: i for i, t in enumerate(vocab)}
        tok = Tokenizer.from_str(json.dumps(raw))
        config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, **TOKENIZER_LAYOUTS[layout]}
    tok.add_tokens([AddedToken(ADDED, special=False, normalized=False)])
    if layout == "llama3-truncation-padding":
        tok.enable_truncation(max_length=8)
        tok.enable_padding(pad_id=2, pad_token=LLAMA3_SPECIALS[2], length=64)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder


def vocab_size_of(folder: Path) -> int:
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


# Llama 3.1-style: llama3 rope, GQA 4:1, untied head, an eos list; Llama 2-style: linear rope,
# tied head, MHA, one eos. 1,100 positions so prompts reach past 1,000.
MODEL_STYLES = {
    "llama3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=16, max_position_embeddings=1100, rms_norm_eps=1e-5,
                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=[1, 2],
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 128}),
    "llama2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, max_position_embeddings=1100, rms_norm_eps=1e-6,
                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                   rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
}


QK_SCALE = 3.0


def write_model(folder: Path, style: str, dtype: torch.dtype, seed: int = 0) -> Path:
    """A random-weight LlamaForCausalLM of `style` (MODEL_STYLES) saved by transformers in `dtype`,
    with its style's tokenizer beside it. initializer_range 0.2 and queries and keys scaled by
    QK_SCALE: rope, norm and precision details change the greedy tokens."""
    import transformers
    write_tokenizer(folder, "llama3" if style == "llama3" else "llama2")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size_of(folder), initializer_range=0.2, **MODEL_STYLES[style])
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharp attention, as trained models have: positions, so rope, decide tokens
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(QK_SCALE)
            layer.self_attn.k_proj.weight.mul_(QK_SCALE)
    model.to(dtype).save_pretrained(folder)
    return folder
