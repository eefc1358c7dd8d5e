import pytest
import torch

from kdlab.engine.batching import pad_left, pad_right, response_logits
from kdlab.engine.data import prompt_ids
from kdlab.models.toy import build_model
from kdlab.engine.rollout import sample
from kdlab.models.tokenizer import EOS_ID, PAD_ID


@pytest.fixture(scope="module")
def models():
    return build_model("llama", "nano", seed=0).eval(), build_model("qwen2", "nano", seed=1).eval()


PROMPTS = ["c12 34 56>78:", "a1+2:", "vhouse:", "m347,291:"]


def test_greedy_matches_transformers_generate(models):
    """Parity with HF generate (greedy, one prompt at a time, no padding)."""
    student, _ = models
    ro = sample(student, [prompt_ids(p) for p in PROMPTS], 12, greedy=True)
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([prompt_ids(p)])
        ref = student.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                               eos_token_id=EOS_ID, pad_token_id=PAD_ID)[0, ids.shape[1]:].tolist()
        if EOS_ID in ref:
            ref = ref[: ref.index(EOS_ID) + 1]
        assert ro.token_lists()[i] == ref


def test_left_padding_does_not_change_logits(models):
    student, _ = models
    resp = [[10, 11, 12], [13, 14]]
    p, pm = pad_left([prompt_ids("a1+2:"), prompt_ids("c12 34 56>78:")])
    r, rm = pad_right(resp)
    batched = response_logits(student, p, pm, r, rm)
    for i, prompt in enumerate(["a1+2:", "c12 34 56>78:"]):
        p1, pm1 = pad_left([prompt_ids(prompt)])
        r1, rm1 = pad_right([resp[i]])
        alone = response_logits(student, p1, pm1, r1, rm1)
        n = len(resp[i])
        assert torch.allclose(batched[i, :n], alone[0, :n], atol=1e-4)


def test_response_logits_equal_the_full_forward_at_the_response_positions(models):
    """``response_logits`` asks the model for the last R positions' logits only
    (``logits_to_keep``); the reference is a plain full forward of prompt + response, read at the
    positions that predict each response token, for both families."""
    resp = [[10, 11, 12, 13], [14, 15]]
    prompts = [prompt_ids("a1+2:"), prompt_ids("c12 34 56>78:")]
    p, pm = pad_left(prompts)
    r, rm = pad_right(resp)
    for model in models:
        got = response_logits(model, p, pm, r, rm)  # (B, R, V)
        assert got.shape == (2, 4, model.config.vocab_size)
        for i, (prompt, row) in enumerate(zip(prompts, resp)):
            ids = torch.tensor([prompt + row])
            with torch.no_grad():
                full = model(input_ids=ids).logits[0]  # (P + n, V)
            ref = full[len(prompt) - 1: len(prompt) - 1 + len(row)]
            assert torch.allclose(got[i, :len(row)], ref, atol=1e-4)


def test_mask_covers_up_to_first_eos_and_entropy_is_zero_after(models):
    student, _ = models
    gen = torch.Generator().manual_seed(0)
    ro = sample(student, [prompt_ids(p) for p in PROMPTS * 4], 20, temperature=1.0, generator=gen)
    for row, m, e in zip(ro.tokens, ro.mask, ro.entropy):
        toks = row.tolist()
        if EOS_ID in toks:
            k = toks.index(EOS_ID)
            assert m[: k + 1].all() and not m[k + 1:].any()
            assert (row[k + 1:] == PAD_ID).all() and (e[k + 1:] == 0).all()
        else:
            assert m.all()


def test_lambda_endpoints_equal_single_model_sampling(models):
    """lam=+1 is the student, lam=-1 the teacher: same draws as sampling that model alone."""
    student, teacher = models
    prompts = [prompt_ids(p) for p in PROMPTS]
    a = sample(student, prompts, 10, lam=-1.0, teacher=teacher, generator=torch.Generator().manual_seed(5))
    b = sample(None, prompts, 10, lam=-1.0, teacher=teacher, generator=torch.Generator().manual_seed(5))
    c = sample(teacher, prompts, 10, lam=1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.tokens, c.tokens)


def test_mixture_sampling_differs_from_both_ends_and_teacher_prompt_is_used(models):
    student, teacher = models
    prompts = [prompt_ids(p) for p in PROMPTS] * 8
    mid = sample(student, prompts, 10, lam=0.0, teacher=teacher, generator=torch.Generator().manual_seed(1))
    assert mid.tokens.shape[0] == len(prompts) and torch.isfinite(mid.entropy).all()
    # A different teacher prompt changes the lam=-1 rollouts (the teacher conditions on its own prompt).
    g = lambda: torch.Generator().manual_seed(2)
    same = sample(None, prompts, 10, lam=-1.0, teacher=teacher, generator=g())
    other = sample(None, prompts, 10, lam=-1.0, teacher=teacher,
                   teacher_prompts=[prompt_ids("ES " + p) for p in PROMPTS] * 8, generator=g())
    assert not torch.equal(same.tokens, other.tokens)


def test_bad_arguments(models):
    student, _ = models
    with pytest.raises(ValueError, match="needs a teacher"):
        sample(student, [prompt_ids("a")], 4, lam=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sample(student, [prompt_ids("a")], 0)
    with pytest.raises(ValueError, match="temperature"):
        sample(student, [prompt_ids("a")], 3, temperature=0.0)


def test_custom_pad_and_stop_ids(models):
    """Real tokenizers: another pad id, several stop ids (the first one met stops the row)."""
    student, _ = models
    prompts = [prompt_ids(p) for p in PROMPTS]
    free = sample(student, prompts, 12, greedy=True, eos_id=-1)  # an id never sampled: nothing stops
    row = free.token_lists()[0]
    stop_a, stop_b = row[4], row[2]
    ro = sample(student, prompts, 12, greedy=True, pad_id=7, eos_id=[stop_a, stop_b])
    k = min(row.index(stop_a), row.index(stop_b))
    assert ro.token_lists()[0] == row[:k + 1]
    assert (ro.tokens[0, k + 1:] == 7).all() and not ro.mask[0, k + 1:].any()
    ids, mask = pad_left([[5, 6], [5]], pad_id=9)
    assert ids.tolist() == [[5, 6], [9, 5]] and mask.tolist() == [[True, True], [False, True]]
    ids, _ = pad_right([[5, 6], [5]], pad_id=9)
    assert ids.tolist() == [[5, 6], [5, 9]]
    with pytest.raises(ValueError, match="eos_id"):
        sample(student, prompts, 3, eos_id=[])
