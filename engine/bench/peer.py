"""The transformers peer: milliseconds per decode step of transformers' own `generate` on the
same folder and the same token-id prompts, greedy, with a static KV cache and the torch.compile
that transformers applies by itself to a static cache on a GPU (mode "reduce-overhead").

Per decode step, by difference: every configuration runs `generate` at a short and a long
max_new_tokens (after one untimed warm-up call each, which compiles), and
ms per step = (time(long) - time(short)) / (long - short), medians over the repeats. Prefill,
cache set-up and per-call overhead are in both calls and cancel. Only on CUDA: transformers
compiles only there, so a CPU figure would be a different peer; on the CPU the report says why
it did not run (tests call `peer_figures` on a CPU model, uncompiled, to check the harness).
"""
import statistics
import time

import torch


def time_generate(model, prompts: list[list[int]], max_new_tokens: int, max_cache_len: int,
                  repeats: int) -> tuple[float, list[list[int]]]:
    """Median seconds of one greedy static-cache `generate` over the batch `prompts` (equal
    lengths), after one untimed call; and the tokens it generated."""
    from transformers import GenerationConfig
    ids = torch.tensor(prompts, device=model.device)
    model.generation_config.eos_token_id = None  # no EOS: every call decodes max_new_tokens, as specgate's ignore_eos
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                  pad_token_id=0, cache_implementation="static")
    if hasattr(GenerationConfig(), "max_cache_len"):  # transformers >= 5.x: one cache size for both lengths
        kwargs["max_cache_len"] = max_cache_len
    cuda = model.device.type == "cuda"
    times = []
    for i in range(repeats + 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        if i:  # the first call compiles and captures
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out[:, ids.shape[1]:].tolist()


def transformers_peer(model_dir, prompts: list[list[int]], concurrencies: list[int], device: str,
                      short: int = 32, long: int = 160, repeats: int = 3, progress=None) -> dict:
    """{"ran": bool, "why"?, "transformers": version, "per_concurrency": {c: {...}}}."""
    if not device.startswith("cuda"):
        return {"ran": False, "why": f"the peer runs on CUDA only (device {device}): transformers "
                                     "compiles a static-cache generate only on a GPU"}
    import transformers
    # The folder's dtype (bf16) as specgate runs it; .to() also covers a transformers that reads
    # `dtype` under another name.
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    return {"ran": True, **peer_figures(model, prompts, concurrencies, short, long, repeats, progress)}


def peer_figures(model, prompts: list[list[int]], concurrencies: list[int], short: int, long: int, repeats: int,
                 progress=None) -> dict:
    """Per concurrency c (the first c prompts), on a loaded model: ms per decode step by the
    difference of a short and a long `generate`, both into one static cache of the long call's size."""
    import transformers
    max_cache_len = len(prompts[0]) + long
    out = {"transformers": transformers.__version__, "device": str(model.device), "dtype": str(model.dtype),
           "method": f"(t(max_new_tokens={long}) - t({short})) / {long - short}, medians of {repeats}",
           "per_concurrency": {}}
    for c in concurrencies:
        t_short, _ = time_generate(model, prompts[:c], short, max_cache_len, repeats)
        t_long, tokens = time_generate(model, prompts[:c], long, max_cache_len, repeats)
        ms = (t_long - t_short) * 1e3 / (long - short)
        out["per_concurrency"][str(c)] = {"ms_per_step": round(ms, 4), "tokens_per_s": round(c * 1e3 / ms, 2),
                                          "compiled": is_compiled(model),
                                          "seconds_short": round(t_short, 4), "seconds_long": round(t_long, 4),
                                          "first_tokens": tokens[0][:16]}
        if progress is not None:
            progress(f"transformers c={c}: {ms:.3f} ms per step")
    return out


def is_compiled(model) -> bool:
    """Whether transformers compiled the model's forward: it keeps the compiled call here once it did."""
    return getattr(model, "_compiled_call", None) is not None
