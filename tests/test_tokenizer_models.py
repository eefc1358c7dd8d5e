import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kdlab.models.toy import FAMILIES, PRESETS, build_model, load_checkpoint, model_config, n_params, save_checkpoint
from kdlab.models.tokenizer import ALPHABET, BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, build_tokenizer, decode, encode


def test_fast_encode_matches_hf_tokenizer(tmp_path):
    tok = build_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "c12 34 56>78:34+56=90,90-12=78#(34+56)-12 " + ALPHABET
    assert encode(text) == tok(text).input_ids == loaded(text).input_ids
    assert loaded.decode(encode(text)) == text
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert len(loaded) == VOCAB_SIZE
    assert loaded.padding_side == "left"


def test_decode_stops_at_eos_and_skips_specials():
    assert decode([BOS_ID] + encode("ab") + [EOS_ID] + encode("zz")) == "ab"
    assert decode([PAD_ID, PAD_ID] + encode("x y")) == "x y"


def test_encode_rejects_non_ascii():
    with pytest.raises(ValueError, match="outside printable ASCII"):
        encode("café")
    with pytest.raises(ValueError):
        encode("a\nb")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpoint_round_trip_is_a_normal_hf_checkpoint(tmp_path, family):
    model = build_model(family, "nano", seed=3)
    sha = save_checkpoint(model, tmp_path / "ck", {"note": "test"})
    meta = json.loads((tmp_path / "ck" / "kdlab.json").read_text())
    assert meta["sha256"] == sha and meta["note"] == "test" and meta["n_params"] == n_params(model)
    # plain transformers loads it, and so does our loader with the hash check
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ck")
    ours = load_checkpoint(tmp_path / "ck", expected_sha256=sha)
    x = torch.tensor([[BOS_ID] + encode("a12+3:")])
    with torch.no_grad():
        ref = model(x).logits
        assert torch.allclose(plain(x).logits, ref) and torch.allclose(ours(x).logits, ref)
    assert AutoTokenizer.from_pretrained(tmp_path / "ck")("a1").input_ids == encode("a1")
    assert type(plain).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]


def test_checkpoint_hash_mismatch_is_refused(tmp_path):
    save_checkpoint(build_model("llama", "nano"), tmp_path / "ck")
    with pytest.raises(ValueError, match="sha256"):
        load_checkpoint(tmp_path / "ck", expected_sha256="0" * 64)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path / "missing")


def test_build_is_deterministic_and_presets_grow():
    a, b = build_model("llama", "nano", seed=1), build_model("llama", "nano", seed=1)
    c = build_model("llama", "nano", seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values()))
    sizes = [n_params(build_model("llama", p)) for p in ("nano", "student-s", "teacher-s")]
    assert sizes == sorted(sizes)


def test_bad_family_or_size_names_the_value():
    with pytest.raises(ValueError, match="'gpt2'"):
        model_config("gpt2", "nano")
    with pytest.raises(ValueError, match="'huge'"):
        model_config("llama", "huge")
    assert set(PRESETS) >= {"nano", "student-s", "teacher-s"}
