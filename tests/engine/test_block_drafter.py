"""The block drafter (spec='block'): exact greedy output, train/inference parity, clear load
errors, and drafts that the target actually accepts."""
import json
import re
import shutil

import pytest
import torch

from engine import SamplingParams
from engine.attention import AttentionMetadata
from engine.block_drafter import BlockProposer, DrafterConfig, load_drafter
from engine.config import EngineConfig
from engine.errors import ModelLoadError, SpecgateError
from engine.loader import load_model
from engine.proposers import ProposeInput
from engine.sampling import SamplingTensors
from fixtures import DRAFTER_DIR
from fixtures.corpus import load_corpus
from fixtures.train_drafter import block_logits

# Greedy acceptance rate of the fixture drafter at k=4 on the first held-out file's first
# 200 bytes (_sitebuiltins.py), 64 new tokens: measured 0.405 (34 of 84 drafts) with the
# checkpoint in fixtures/drafter; ngram gets 0.18 on that file. An untrained drafter gets ~0.05.
MIN_ACCEPTANCE_RATE = 0.3


@pytest.fixture(scope="module")
def heldout_prompts():
    corpus = load_corpus()
    return [corpus.read(f)[:200].decode("utf-8", errors="ignore") for f in corpus.heldout_files[:4]]


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_block_output_equals_plain(make_llm, heldout_prompts, k):
    prompts = [heldout_prompts[0], heldout_prompts[1][:17], "x", heldout_prompts[2][:90]]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = make_llm().generate(prompts, params)
    spec = make_llm(spec="block", num_spec_tokens=k).generate(prompts, params)
    for out, ref in zip(spec, plain):
        assert out.token_ids == ref.token_ids
        assert out.stats.num_drafts > 0 and out.stats.num_draft_tokens == k * out.stats.num_drafts
    assert sum(o.stats.num_accepted_tokens for o in spec) > 0  # the case "a draft was accepted" occurred


def test_drafts_are_accepted_on_heldout_text(make_llm, heldout_prompts):
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    out = make_llm(spec="block", num_spec_tokens=4).generate([heldout_prompts[0]], params)[0]
    rate = out.stats.num_accepted_tokens / out.stats.num_draft_tokens
    assert rate > MIN_ACCEPTANCE_RATE, out.stats


def test_sampled_block_run_accepts_drafts(make_llm, heldout_prompts):
    params = SamplingParams(temperature=0.7, top_k=20, max_tokens=48, seed=5, ignore_eos=True)
    outs = make_llm(spec="block", num_spec_tokens=4).generate(heldout_prompts[:2], params)
    assert all(len(o.token_ids) == 48 for o in outs)
    assert sum(o.stats.num_accepted_tokens for o in outs) > 0


def test_propose_matches_training_forward(target_dir):
    """The paged inference path (observe, then propose through block tables) computes the
    same draft distribution as the dense training path at the same anchor."""
    torch.manual_seed(0)
    cfg = EngineConfig(model=str(target_dir), spec="block", num_spec_tokens=4, max_model_len=128,
                       block_size=16, max_num_seqs=2)
    target = load_model(target_dir)
    proposer = BlockProposer.from_dir(DRAFTER_DIR, target, cfg)
    tokens = torch.randint(0, 256, (2, 100))
    _, aux = target.forward_dense(tokens, proposer.aux_layers)
    # Request r owns KV blocks in reversed order, so the block-table indirection is exercised.
    tables = torch.stack([torch.arange(7, -1, -1), torch.arange(15, 7, -1)])
    positions = torch.arange(100).repeat(2)
    req = torch.arange(2).repeat_interleave(100)
    slots = tables[req, positions // 16] * 16 + positions % 16
    meta = AttentionMetadata(slots, None, None, None, None, 0)
    proposer.observe([a.flatten(0, 1) for a in aux], meta, positions, req)
    anchors = torch.tensor([[37], [81]])
    n = 2
    _, _, q = proposer.propose(ProposeInput(
        tokens, anchors[:, 0] + 1, SamplingTensors(temperature=torch.ones(n), top_k=torch.full((n,), -1),
                                                   top_p=torch.ones(n), keys=torch.zeros(n, dtype=torch.long)),
        torch.arange(n), tables))
    with torch.no_grad():
        dense = block_logits(proposer.drafter, target, tokens, aux, anchors)
    torch.testing.assert_close(q, dense[:, :4].softmax(-1), atol=1e-5, rtol=1e-4)


def _copy_drafter(tmp_path):
    folder = tmp_path / "drafter"
    shutil.copytree(DRAFTER_DIR, folder)
    return folder


def _edit_config(folder, **changes):
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize("breakage, message", [
    ("no_folder", "does not exist"),
    ("no_config", "has no config.json"),
    ("no_weights", "has no model.safetensors"),
    ("bad_json", "is not valid JSON"),
    ("wrong_type", "not a block drafter"),
    ("missing_field", "missing required fields: aux_layers"),
    ("hidden_size", "hidden_size 256 does not match the target's 192"),
    ("vocab_size", "vocab_size 300 does not match the target's 260"),
    ("aux_out_of_range", "aux_layers [4] are outside the target's layers [0, 4)"),
    ("layer_count", "tensors do not match the config"),
    ("fc_shape", "tensor fc.weight has shape"),
    ("corrupt_weights", "model.safetensors is not a readable safetensors file: "),
])
def test_from_dir_refuses_bad_folder(tmp_path, target_dir, breakage, message):
    folder = _copy_drafter(tmp_path)
    if breakage == "no_folder":
        folder = tmp_path / "absent"
    elif breakage == "no_config":
        (folder / "config.json").unlink()
    elif breakage == "no_weights":
        (folder / "model.safetensors").unlink()
    elif breakage == "bad_json":
        (folder / "config.json").write_text("{not json")
    elif breakage == "wrong_type":
        _edit_config(folder, model_type="llama")
    elif breakage == "missing_field":
        raw = json.loads((folder / "config.json").read_text())
        del raw["aux_layers"]
        (folder / "config.json").write_text(json.dumps(raw))
    elif breakage == "hidden_size":
        _edit_config(folder, hidden_size=256)
    elif breakage == "vocab_size":
        _edit_config(folder, vocab_size=300)
    elif breakage == "aux_out_of_range":
        _edit_config(folder, aux_layers=[1, 2, 4])
    elif breakage == "layer_count":
        _edit_config(folder, num_hidden_layers=3)
    elif breakage == "corrupt_weights":
        (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    elif breakage == "fc_shape":
        _edit_config(folder, aux_layers=[1, 3])  # the checkpoint has three
    target = load_model(target_dir)
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        load_drafter(folder, target.config)


def test_engine_reports_a_bad_drafter_folder(make_llm, tmp_path):
    with pytest.raises(ModelLoadError) as refused:
        make_llm(spec="block", drafter=str(tmp_path / "absent"))
    assert str(refused.value) == f"drafter folder {tmp_path / 'absent'} does not exist or is not a folder"


def test_a_drafter_that_does_not_fit_its_target_is_told_why(target_dir, tmp_path):
    """What the gates print when they skip the block drafter: the missing folder, the shape that
    does not fit (from the drafter's config.json), or the training target's weights, by the first
    12 hex digits of both checksums. A drafter that names no training target is judged by its
    shapes alone (the target's weights are not even read)."""
    from engine.block_drafter import mismatch_with_target
    from engine.loader import weights_sha256
    assert mismatch_with_target(None, target_dir) == "no block drafter folder was given"
    assert mismatch_with_target(DRAFTER_DIR, target_dir) is None
    wide = _copy_drafter(tmp_path / "wide")
    _edit_config(wide, hidden_size=256)
    assert mismatch_with_target(wide, target_dir) == (
        f"the block drafter {wide} does not fit the target {target_dir}: {wide / 'config.json'}: drafter "
        f"hidden_size 256 does not match the target's 192")
    other = _copy_drafter(tmp_path / "other")
    _edit_config(other, target_sha256="ab" * 32)
    assert mismatch_with_target(other, target_dir) == (
        f"the block drafter {other} was trained for another target (target_sha256 abababababab..., this "
        f"target's weights {weights_sha256(target_dir)[:12]}...)")
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(target_dir / "config.json", config_only / "config.json")
    unnamed = _copy_drafter(tmp_path / "unnamed")
    raw = json.loads((unnamed / "config.json").read_text())
    del raw["target_sha256"]
    (unnamed / "config.json").write_text(json.dumps(raw))
    assert mismatch_with_target(unnamed, config_only) is None


def test_more_drafts_than_trained_block_is_refused(make_llm):
    k_max = DrafterConfig.from_dir(DRAFTER_DIR).block_size
    with pytest.raises(SpecgateError, match=f"exceeds the block drafter's block_size \\({k_max}\\)"):
        make_llm(spec="block", num_spec_tokens=k_max + 1)
