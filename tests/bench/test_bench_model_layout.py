"""The benchmark folder's files as a loader or a reader of published checkpoints meets them
(engine/bench/models.py): config.json, the index and the marker, pretty-printed and exact; the
shards' safetensors metadata; where the shard plan puts the embedding, the layers and the head;
the seeded prompts every peer is given; and the refusals, word for word."""
import json

import pytest
from safetensors import safe_open

from engine.bench.models import MARKER_FILE, SHAPES, bench_prompts, tensor_shapes, write_bench_model
from engine.errors import SpecgateError
from engine.loader import INDEX_FILE

TINY_BYTES = 214656  # 107,328 bfloat16 parameters: the embedding and head 260 x 64, two layers of 36,992, a norm


def read_pretty_json(path) -> dict:
    """The file's JSON, checked to be written as published checkpoints are: indented by 2, a final newline."""
    text = path.read_text()
    raw = json.loads(text)
    assert text == json.dumps(raw, indent=2) + "\n", path.name
    return raw


def test_the_default_folder_of_a_shape_is_its_seed_0_folder_written_shard_by_shard(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGATE_CACHE", str(tmp_path))
    told = []
    folder = write_bench_model("tiny", progress=told.append)
    assert folder == tmp_path / "bench-models" / "tiny-seed0"
    assert told == ["wrote model-00001-of-00002.safetensors (1 of 2)",
                    "wrote model-00002-of-00002.safetensors (2 of 2)"]
    config = read_pretty_json(folder / "config.json")
    assert (config["rope_theta"], config["rms_norm_eps"], config["hidden_size"]) == (500000.0, 1e-5, 64)
    index = read_pretty_json(folder / INDEX_FILE)
    assert index["metadata"] == {"total_size": TINY_BYTES}
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), "pt") as f:
            assert f.metadata() == {"format": "pt"}, shard
    assert json.loads((folder / MARKER_FILE).read_text()) == {
        "shape": "tiny", "seed": 0, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "layers_per_shard": 1, "initializer_range": 0.2,
        "max_position_embeddings": 512, "dtype": "bfloat16", "vocab_size": 260, "decisive": False}


def test_the_embedding_opens_the_first_shard_and_the_norm_and_head_close_the_last():
    plan = tensor_shapes(SHAPES["llama-1b"])
    layers = [sorted({int(name.split(".")[2]) for name, _ in shard if name.startswith("model.layers.")})
              for shard in plan]
    assert layers == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    outside = [[name for name, _ in shard if not name.startswith("model.layers.")] for shard in plan]
    assert outside == [["model.embed_tokens.weight"], [], [], ["model.norm.weight", "lm_head.weight"]]
    assert plan[0][0] == ("model.embed_tokens.weight", (260, 2048))


def test_the_prompts_are_bos_then_seeded_bytes_and_seed_0_unless_asked():
    """Pinned: the transformers peer's prompts (seed 0) are those of every earlier measurement."""
    assert bench_prompts(2, 6) == [[256, 172, 47, 117, 192, 67], [256, 251, 195, 103, 9, 211]]
    assert bench_prompts(1, 6, seed=3) == [[256, 106, 152, 249, 131, 184]]


def test_a_file_or_a_folder_holding_anything_else_is_refused_and_kept(tmp_path):
    afile = tmp_path / "model"
    afile.write_text("mine")
    with pytest.raises(SpecgateError, match=f"^{afile} exists and is not a folder$"):
        write_bench_model("tiny", folder=afile)
    folder = tmp_path / "m"
    folder.mkdir()
    names = ["other.safetensors", "model-notes.txt", "a.txt", "b.txt", "c.txt", "d.txt"]
    for name in names + ["config.json", "model-00001-of-00002.safetensors"]:
        (folder / name).write_text("mine")
    with pytest.raises(SpecgateError) as refused:
        write_bench_model("tiny", folder=folder)
    assert str(refused.value) == (f"{folder} holds files that are not a benchmark model's (a.txt, b.txt, c.txt, d.txt, "
                                  "model-notes.txt); choose an empty or new folder")
    assert all((folder / name).read_text() == "mine" for name in names)
    with pytest.raises(SpecgateError, match=r"^unknown benchmark shape 'llama-70b' \(known: llama-1b, llama-1b-deep, "
                                            r"tiny, tiny-decisive, tiny-deep\)$"):
        write_bench_model("llama-70b", folder=tmp_path / "x")
