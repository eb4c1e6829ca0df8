"""The catalogue of seeded defects: each a small patch to the engine (mutants/proof/patches/<name>.diff),
the real-world failure it models, and the gates that must go red on it.

`token_invisible` claims the defect leaves every output token unchanged, greedy and seeded
sampled alike (lossless verify hides it): `specgate prove` runs the lossless gate on every
defect and fails when such a defect turns it red, so the claim is checked, not assumed.
`needs="cuda"` marks a defect only a GPU can show (a host sync, a graph capture): on a machine
without CUDA it is listed and reported skipped. `forward="compiled"` marks a defect that lives in
the compiled forward only (engine/fused.py, the compiled pieces of the step): its gates run with
both forwards judged (on the CPU: the gates' compiled case, which inductor compiles for a minute),
and so does the clean tree of a proof that holds one.

proven_against() joins DEFECTS with the gate registry's names: which defects each gate is proven
against (`specgate gates list`, the gates' reports). Add a defect: see mutants/README.md.

Over 300 lines because it is the one list of every seeded defect, each entry the sentences of the
failure it models: prove, the gates' reports and docs/proof.md read it whole.
"""
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gates.registry import FORWARDS, NEEDS, check_name

PATCHES = Path(__file__).resolve().parent / "patches"


@dataclass(frozen=True)
class Defect:
    name: str                  # kebab-case; its patch is patches/<name>.diff
    models: str                # the real failure it stands for, in a sentence or two
    gates: tuple[str, ...]     # gates that must go red on it
    token_invisible: bool = False
    needs: str = "cpu"         # "cuda": only observable on a GPU
    forward: str = "reference"  # "compiled": lives in the compiled forward only; its gates judge both

    def __post_init__(self):
        check_name("defect", self.name)
        if self.needs not in NEEDS:
            raise ValueError(f"defect {self.name}: needs must be 'cpu' or 'cuda', got {self.needs!r}")
        if self.forward not in FORWARDS:
            raise ValueError(f"defect {self.name}: forward must be one of {FORWARDS}, got {self.forward!r}")
        if not self.gates:
            raise ValueError(f"defect {self.name} names no gate")

    @property
    def judged_forwards(self) -> tuple[str, ...]:
        """The forwards its gates judge: both for a defect of the compiled forward (on the CPU, the gates'
        compiled case then runs), else the gates' default (none given)."""
        return FORWARDS if self.forward == "compiled" else ()

    @property
    def patch(self) -> Path:
        return PATCHES / f"{self.name}.diff"


DEFECTS = (
    # ---- the logits window (reason A), once per arm ----------------------------------------------
    Defect("reason-a-eager-arm",
           "Reason A in the eager arm: cu_num_logits is not passed, so each row's gather falls back to "
           "query_end - 1, the last draft slot of a verify step (the A2-3 regression, re-armed from one arm).",
           ("reason-a", "emit-count", "lossless")),
    Defect("reason-a-graph-arm",
           "Reason A in the graph arm only: the padded bucket is planned with one logit per row, so the "
           "gather reads query_end - 1 in every replayed step while the eager arm stays right.",
           ("reason-a", "emit-count")),
    # ---- what the async combine feeds ------------------------------------------------------------
    Defect("predicate-split-first-row",
           "Predicate split: the device-fed decision is taken per step from the first request, not per "
           "request, so a refused request (prefill, resumed, host history) sharing a step with device-fed "
           "ones is fed stale device ids (the num_reqs == 1 blind spot, #2710).",
           ("predicate-split", "combine", "emit-count")),
    Defect("stale-drafts",
           "Stale drafts: device-fed rows combine and verify drafts from a snapshot taken before the last "
           "propose wrote the buffer, one step old (and another request's on a reused slot); vLLM's "
           "acceptance near 1% under async.",
           ("combine", "emit-count")),
    Defect("prefill-proposes-nothing",
           "The first verify step proposes nothing: after a prefill (or a resume) the drafter's num_draft is "
           "zeroed, so each request's first verify step carries no drafts (#2920: the async decode arm never "
           "proposed). Greedy tokens stay right; a seeded sampled request's change after a resume, where the "
           "unpreempted run verified drafts (no longer token-invisible since a resume keeps its drafts).",
           ("emit-count", "lossless")),
    Defect("drafts-by-batch-row",
           "Batch rows moved without the device rows: propose writes drafts by batch row instead of state "
           "slot, so after a finish or an admission a request verifies another request's drafts (races "
           "between copies and row moves, bugs only at batch size > 1).",
           ("emit-count", "combine")),
    Defect("positions-advance-by-k",
           "Device positions advance by k + 1 instead of num_accepted + 1: the scheduler's assumption that "
           "every draft is accepted is never corrected on the device (vLLM's corrected token counts, "
           "SGLang's lengths + accept length).",
           ("lossless", "combine", "emit-count")),
    Defect("padding-writes-a-real-slot",
           "The graph arm's padding rows write the last real state slot instead of a padding slot, so a "
           "request in that slot has its committed ids and length overwritten by padding.",
           ("combine", "emit-count")),
    Defect("kv-lookahead-ignores-in-flight-step",
           "KV reserved for this step's drafts only, not for the step still in flight: the async runner "
           "writes up to k + 1 positions past the blocks the host reserved (SGLang over-allocates one step "
           "for this reason).",
           ("lossless", "combine")),
    # ---- the request lifecycle: aborts and scheduling gaps ----------------------------------------
    Defect("abort-frees-in-flight-slot",
           "An abort frees at once what the step in flight still holds: the aborted request's state slot and KV "
           "blocks go back at abort time, so the next step plans a new admission (or a running request's "
           "growth) onto them while the old step writing them is unread (vLLM: an abort frees a slot the "
           "in-flight step still writes). On one CUDA stream the writes stay ordered, so tokens are unchanged; "
           "the lifecycle check of the plans sees the hand-over.",
           ("combine", "emit-count", "predicate-split"), token_invisible=True),
    Defect("abort-leaks-held-slot",
           "An abort with a step in flight never gives back what it held: the slot and KV blocks reserved for "
           "that step stay taken after the step is read, so every such abort shrinks the engine for good "
           "(counters and reservations lost with outputs in flight).",
           ("combine", "emit-count", "predicate-split"), token_invisible=True),
    Defect("abort-applied-when-step-read",
           "An abort with a step in flight applied only when that step is read: the request stays in the running "
           "list, so the next step is planned with it (its draft slots verified, its KV written) although it "
           "emits nothing, and its slot and blocks are then given back while that step is in flight (an "
           "aborted request the backend still looks up).",
           ("combine", "emit-count", "predicate-split"), token_invisible=True),
    Defect("trace-forgets-step-in-flight",
           "The step trace loses what was in flight at each launch (StepTrace.launched_behind stays None), so "
           "every check that reads it, an aborted request's slot and blocks held behind its step and the KV "
           "reserved behind the step in flight, finds nothing to compare and passes by skipping: the class of "
           "a check that goes quiet when its input is lost. Tokens unchanged.",
           ("combine", "emit-count", "predicate-split"), token_invisible=True),
    Defect("gap-drops-drafts",
           "Draft state that lives one round: each step clears num_draft of every slot it did not run, so a "
           "running request left out of a step by the token budget comes back verifying no drafts (the "
           "mirror of vLLM's placeholders outliving their window; only a scheduling gap reaches it).",
           ("emit-count",), token_invisible=True),
    Defect("committed-length-wraps-at-2048",
           "A depth-only defect: the device's committed length is kept in a ring of 2,048 positions (a table "
           "sized for short contexts), so past position 2,048 a request's positions and drafts are taken from "
           "the wrapped length. On a decisive target every token stays right while the oracle's acceptance "
           "collapses (the public report: acceptance dead past 32,768 positions, the target coherent); the "
           "gates' 256-position engines never reach it.",
           ("depth",), token_invisible=True),
    # ---- the scheduler's own limits: the token budget and the KV reservations ----------------------
    Defect("budget-counts-verify-row-as-one-token",
           "A token budget written before speculation: a running request's row is charged one token, its k "
           "draft slots ride along uncounted, so a step of verify rows plus a prefill overruns "
           "max_num_batched_tokens (vLLM's budget must count num_lookahead_slots). The staging buffers hold "
           "max_num_seqs x (k + 1) tokens, so the step runs and every token stays right; only the per-step "
           "limits check sees the step of 97 tokens under a budget of 96.",
           ("emit-count", "combine"), token_invisible=True),
    Defect("kv-lookahead-forgets-in-flight-bonus-token",
           "The async KV lookahead counts the step in flight's k drafts but not its bonus token (k + k, not "
           "k + (k + 1)): when that step accepts every draft, the next step's last draft slot can fall one "
           "position past the blocks reserved, into the sink block. The row reads back what it wrote there, "
           "so tokens change only when that draft is accepted too and its KV is needed later (the "
           "over-allocation SGLang and vLLM make for the step in flight, off by one); the per-step limits "
           "check sees the reservation short at the worst case whatever was accepted.",
           ("emit-count", "combine", "lossless")),
    # ---- host write-back ---------------------------------------------------------------------------
    Defect("committed-ids-dropped-on-preemption",
           "Committed ids not written back on one branch: results of a step in flight when its request was "
           "preempted are dropped, so the host's ids go stale and the resume recomputes them (counters and "
           "outputs in flight across preemption).",
           ("emit-count",), token_invisible=True),
    Defect("emit-past-finish",
           "Finishing detected one step late is not guarded: the host applies the step the async runner "
           "launched past a request's end, emitting tokens past max_tokens or EOS.",
           ("lossless", "emit-count")),
    # ---- counting acceptance ---------------------------------------------------------------------
    Defect("denominator-counts-k",
           "An acceptance denominator inflated by padded drafts: stats count the k slots scheduled instead "
           "of num_draft (a drafter that trimmed drafts while the scheduler still counted them).",
           ("emit-count", "acceptance"), token_invisible=True),
    Defect("verify-steps-skip-width-0",
           "A decode step with nothing to verify counted as no verify step: a request sampled on the host "
           "(spec width 0 beside drafting ones) emits a token each step and reports no verify steps for "
           "them, so completion = prefills + verify steps + accepted - truncated fails and the accept "
           "length (completion / verify steps) of a batch with such a request is overstated.",
           ("emit-count", "acceptance"), token_invisible=True),
    Defect("fold-acceptance-over-every-leg",
           "The warm-leg predicate applied to one axis only: throughput folds the warm legs, acceptance "
           "folds every leg, so the two axes describe different populations (the DFlash2 gap that could "
           "not be attributed).",
           ("acceptance",), token_invisible=True),
    Defect("fold-per-position-zip-truncates",
           "Per-position acceptance merged with zip(), which stops at the shorter list: folding legs into "
           "an empty total keeps no position at all, so the fold's and the plot's acceptance per draft "
           "position are empty while every counter is right (lists of unequal length, a classic merge bug; "
           "the fold check compared counters and tau only before). Tokens are unchanged; not claimed "
           "token-invisible only so prove spares it a lossless run.",
           ("acceptance",)),
    Defect("fold-acceptance-skips-first-leg",
           "One axis with a hard-coded warm-up: the fold merges acceptance over every leg past the first "
           "(written when the bench always ran one warm-up leg) while throughput folds the warm legs, so at "
           "any other --warmup-legs the two axes describe different legs; at one warm-up leg, the only "
           "setting the acceptance gate ran before, the two sets are the same. Tokens are unchanged; not "
           "claimed token-invisible only so prove spares it a lossless run.",
           ("acceptance",)),
    Defect("veto-ignores-env",
           "The veto lifted at one site only: VT_ASYNC_RUNNER=1 no longer selects the async runner for "
           "speculative decoding, so an A/B labelled async measures sync against sync.",
           ("speed-ab",), token_invisible=True),
    # ---- drafting and verifying --------------------------------------------------------------------
    Defect("ngram-continuation-off-by-one",
           "The ngram proposer is off by one: the continuation starts at the match's last token, so every "
           "draft is shifted and mostly rejected; only acceptance moves.",
           ("emit-count",), token_invisible=True),
    Defect("resample-from-p",
           "A lossy acceptance rule: at the first rejection the token is resampled from p instead of "
           "norm(max(0, p - q)), over-weighting the rejected draft (greedy output unchanged).",
           ("lossless",)),
    # ---- the compiled forward only ---------------------------------------------------------------
    Defect("fused-aux-hidden-states-off-by-one-layer",
           "The fused forward hands the block drafter the hidden state entering each aux layer (vLLM's "
           "aux_hidden_state_layers convention) where the reference hands it the layer's output (Hugging "
           "Face's, the one the drafter was trained on): every aux layer one off, in the compiled forward "
           "only. Tokens stay right (verify is lossless) and acceptance drops; the compiled arm's own "
           "async-vs-sync comparison shares the fault, so only its emit counts against the reference "
           "forward's show it. Not claimed token-invisible: seeded sampled tokens follow the drafts.",
           ("emit-count",), forward="compiled"),
    # ---- only a GPU shows these ------------------------------------------------------------------
    Defect("host-sync-in-device-step",
           "A host synchronisation slipped into the async step: the logits count is read back from the "
           "device (.item()) instead of taken from the host plan, so the host waits on every step (no-sync's "
           "host-read hook shows it on the CPU too; on CUDA sync debug mode raises).",
           ("no-sync",)),
    Defect("graph-warmup-on-real-batch",
           "Graph capture warm-up on real inputs: the first step of each bucket runs twice (warm-up, then "
           "replay), and device-fed rows advance their state twice.",
           ("combine", "emit-count"), needs="cuda"),
    Defect("blocking-result-download",
           "Results downloaded with a blocking copy: the host waits for every step before launching the "
           "next, so the async runner overlaps nothing (the runner's results download, ResultRing.download).",
           ("busy", "no-sync"), needs="cuda"),
    Defect("one-token-steps-on-cublas",
           "The compiled forward's one-token path switched off by an allow-list that spells the checkpoint's "
           "activation another framework's way (\"swish\" for Hugging Face's \"silu\"): every one-token step "
           "falls back to the cuBLAS matmuls and their neighbours' kernels. Tokens stay right, the c=1 step "
           "is about 10% slower, and spec against plain no longer compares the GEMV path with cuBLAS; "
           "lossless counts the GEMV calls of its routing workload, step size by step size (CUDA's compiled "
           "forward only).",
           ("lossless",), needs="cuda", forward="compiled"),
    # ---- the host loop ---------------------------------------------------------------------------
    Defect("host-read-in-step-loop",
           "A blocking read in the host loop, outside the runner: right after launching a step the host "
           "reads the committed count from the device state (int(tensor), for a progress line), "
           "so on a GPU it waits for every "
           "step before planning the next; no-sync's host-read hook shows it on the CPU too.",
           ("no-sync",), token_invisible=True),
    # ---- paths both sides of every differential comparison share (the absolute reference) -------
    Defect("stop-token-ids-ignored",
           "A request's stop_token_ids are never checked in the finish rule that plain, spec, sync and async "
           "share, so it runs on to max_tokens; every differential comparison agrees with itself and only the "
           "reference decoder sees the tokens past the stop (no gate workload set stop_token_ids before).",
           ("emit-count",)),
    Defect("processor-history-includes-prompt",
           "Logits processors handed the request's whole token list, prompt and output (the list the planner "
           "reads), where the contract is the output so far (vLLM's two processor signatures): plain, spec, "
           "sync and async share it, and a processor that reads only the last token sees the prompt just once, "
           "at the first token, so only a first token equal to the prompt's last, by luck, showed it.",
           ("lossless", "emit-count")),
    Defect("processors-skip-prefill-row",
           "Logits processors applied to decode rows only: the token a prefill samples, a request's first and "
           "the first after each resume from preemption, is left unprocessed. A fresh request's history is "
           "empty there, so a processor that bans the last token changes nothing; only a resumed request's "
           "first token, repeating its last one by luck, showed it.",
           ("lossless", "emit-count")),
    Defect("context-limit-off-by-one",
           "The context-limit finish is off by one in the shared finish rule: a request ends only past "
           "max_model_len, one token beyond its context, in every runner alike; only the reference decoder "
           "knows where the context ends.",
           ("emit-count",)),
    # ---- the sampled path at binding temperature, top-k and top-p --------------------------------
    Defect("draft-q-before-top-k-top-p",
           "The block drafter hands verify q taken before top-k/top-p (softmax of logits / T over the whole "
           "vocabulary) while its drafts were drawn from the cut q: the acceptance ratio and the residual use "
           "a q the drafts did not come from (lossy wherever top-k or top-p binds).",
           ("lossless",)),
    Defect("verify-p-ignores-top-k-top-p",
           "Verify processes p with temperature only, while the drafter's q is cut by top-k and top-p: the "
           "target distribution loses its cut, so tokens outside top-k/top-p are emitted (only visible when "
           "the cuts bind, which the verify chi-square with its own q never made them do).",
           ("lossless",)),
    Defect("draft-q-top-k-ties-cut-by-rank",
           "p and q processed by two rules: the block drafter drops all but the top_k best logits by rank before "
           "the shared processing, so at a tie at the k-th logit (frequent in bfloat16) q keeps exactly k tokens, "
           "the sort's choice among equals, while verify's p keeps every tied token. Its drafts still come from "
           "the q it hands verify, so the output stays lossless; float32 logits almost never tie, so only a "
           "check of q against p on tied rows sees it (the bfloat16 run's stored q, the one-rule check).",
           ("lossless",)),
    Defect("verify-p-top-k-ties-cut-by-rank",
           "p and q processed by two rules, on verify's side: verify drops all but the top_k best logits by rank "
           "before the shared processing, so at a tie at the k-th logit p keeps exactly k tokens (the sort's "
           "choice among equals) while the drafter's q and the sampler's rule keep every tied token: a tied "
           "token the rule allows is never emitted. float32 logits almost never tie, so every float32 check "
           "stays green; a verify chi-square at a tied bfloat16 cut and the one-rule check see it.",
           ("lossless",)),
    # ---- LLM options that change the token path ---------------------------------------------------
    Defect("dtype-overridden-by-checkpoint",
           "An LLM option silently ignored: the checkpoint's dtype (config.json's torch_dtype) overrides the "
           "dtype asked for, so dtype='bfloat16' runs float32 on a float32 checkpoint; every token can stay "
           "right, only a check that the weights and KV cache really are bfloat16 sees it (no gate ran "
           "bfloat16 before).",
           ("lossless",)),
    Defect("engine-seed-ignored",
           "The engine seed never reaches the generator that keys unseeded sampled requests: runs are "
           "reproducible, but every engine seed gives the same tokens (seeded gate workloads never drew "
           "from it).",
           ("lossless",)),
    # ---- seeded reproducibility (lossless: alone, batched and preempted alike) ---------------------
    Defect("resume-drops-held-drafts",
           "A resume that only recomputes the history: the drafts a request held when it was preempted are "
           "dropped, so its resume point is drawn straight from p where the unpreempted run verified a draft "
           "there (and the block drafter's next block starts elsewhere, with another q): a seeded request's "
           "tokens change with preemption while staying distributed as the target (issue 34's finding).",
           ("lossless",)),
    Defect("resume-restarts-the-random-stream",
           "The random numbers of a row counted from its query's first token: right for every decode and "
           "verify row, but a prefill's start at position 1, so a resumed request's accept decisions and its "
           "token are drawn with the counters of positions it drew long ago (a stream that restarts on "
           "resume); every token stays distributed as the target, greedy runs are unchanged.",
           ("lossless",)),
    Defect("seed-key-by-state-slot",
           "A random stream per state slot: the request's key offset by the slot it runs in (per-row "
           "generators), so a seeded request's tokens depend on which slot the batch gave it: the same on "
           "both runners and arms (the slots are), different alone and batched or after a resume.",
           ("lossless",)),
    # ---- what transformers computes (the oracle gate) ---------------------------------------------
    Defect("rotary-frequencies-in-bfloat16",
           "Rope angles computed from inv_freq cast to the activations' dtype, so a bfloat16 engine rounds the "
           "frequencies (issue 35's first finding, which the loader's cast made): off by up to 1e-3, about a "
           "radian at position 1,000; every check that compares the engine with itself or its own reference "
           "decoder shares the rounding, only transformers does not.",
           ("oracle",)),
    Defect("llama-tokenizer-legacy-by-default",
           "A LlamaTokenizer folder without a `legacy` key read as legacy (transformers 4's slow tokenizer "
           "default; transformers 5 says false): \"▁\" is prepended after every special token, so text after "
           "<s> or </s>, and every rendered Llama 2 chat prompt, encodes differently from AutoTokenizer.",
           ("oracle",)),
    Defect("tokenizer-json-truncation-kept",
           "tokenizer.json's truncation section left on (padding dropped): prompts are cut to its max_length "
           "silently, where transformers' encode ignores it unless asked (issue 35's second finding).",
           ("oracle",)),
)


def by_name(names: list[str] | None = None) -> list[Defect]:
    known = {d.name: d for d in DEFECTS}
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise KeyError(f"unknown defect(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names] if names else list(DEFECTS)


def proven_against(gate_names: Iterable[str], defects=DEFECTS) -> dict[str, tuple[str, ...]]:
    """gate -> the defects that name it (must turn it red), for each gate named."""
    return {g: tuple(d.name for d in defects if g in d.gates) for g in gate_names}
