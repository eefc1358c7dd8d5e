"""The real-checkpoint path on tiny random Llama / Qwen2 checkpoints with byte-level BPE tokenizers:
loading, vocabulary checks, prompts (``kdlab.models.codec.HFCodec``), kdlab's one sampler with real pad /
stop ids, its one distillation loop (OffPD and OnPD, micro-batches) and its one evaluation path
with the real-dataset tasks and graders.

The shared MedQA / MATH-500 files are evaluation data: they are only loaded, rendered and graded
here; the training steps use made-up questions (``tiny_hf.write_synthetic_choice``)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kdlab.models import hf
from kdlab.engine import rollout
from kdlab.engine.batching import pad_left, pad_right, response_logits
from kdlab.models.codec import HFCodec
from kdlab.engine.data import ProblemPool
from kdlab.engine.run_config import RunConfig
from kdlab.engine.distill import distill
from kdlab.engine.offpd import offpd_rollouts
from kdlab.evaluation.evaluate import accuracy, complete
from kdlab.core.kl import kl_loss
from kdlab.core.mixture import mixture_logprobs
from kdlab.tasks.base import split_of
from kdlab.tasks.grading import grade_choice
from kdlab.tasks.real import EVAL_ONLY, ChoiceTask, MathTask, load_benchmarks, parse_options, read_rows, real_task
from tiny_hf import build_pair, write_synthetic_choice

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT.parent / "shared" / "data"
MEDQA, MATH500 = DATA / "medqa_test.jsonl", DATA / "math500_test.jsonl"
FAMILIES = ("llama", "qwen2")


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared data directory ../shared/data is not mounted)")
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("ckpts")
    return {fam: build_pair(root, fam) for fam in FAMILIES}


@pytest.fixture(scope="module")
def loaded(ckpts):
    """fp32 (teacher, student, tokenizer) per family."""
    out = {}
    for fam, (t_dir, s_dir) in ckpts.items():
        teacher, t_tok = hf.load_pretrained(t_dir, "fp32", "cpu")
        student, tok = hf.load_pretrained(s_dir, "fp32", "cpu")
        out[fam] = (teacher, student, tok, t_tok)
    return out


@pytest.fixture(scope="module")
def medqa() -> ChoiceTask:
    return ChoiceTask(need(MEDQA), fractions=EVAL_ONLY)


# --------------------------------------------------------------------------------------------
# Loading, vocabulary, special ids, prompts
# --------------------------------------------------------------------------------------------

def test_load_pretrained_dtype_device_and_checkpointing(ckpts):
    _, s_dir = ckpts["llama"]
    model, tok = hf.load_pretrained(s_dir)  # defaults: bf16, auto device
    assert next(model.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).device.type == hf.pick_device()
    assert not model.training and tok.padding_side == "left"
    ckpt, _ = hf.load_pretrained(s_dir, "fp32", "cpu", gradient_checkpointing=True)
    on = getattr(type(ckpt), "is_activation_checkpointing", None)  # transformers >= 5.x name
    assert next(ckpt.parameters()).dtype == torch.float32
    assert (ckpt.is_activation_checkpointing if on is not None else ckpt.is_gradient_checkpointing)
    with pytest.raises(ValueError, match="dtype"):
        hf.load_pretrained(s_dir, "int3")
    with pytest.raises(ValueError, match="device"):
        hf.load_pretrained(s_dir, "fp32", "tpu:x")
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load_pretrained(s_dir.parent / "missing")


def test_pick_device(monkeypatch):
    assert hf.pick_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hf.pick_device() == "cuda"


def test_check_same_vocab_accepts_equal_and_names_mismatches(ckpts, loaded, tmp_path):
    _, _, tok, t_tok = loaded["qwen2"]
    hf.check_same_vocab(t_tok, tok)  # the pair shares one tokenizer
    llama_tok = loaded["llama"][2]
    # Independent reference: ids whose token strings differ between the two vocabularies.
    a = {i: t for t, i in llama_tok.get_vocab().items()}
    b = {i: t for t, i in tok.get_vocab().items()}
    first = next((i, a.get(i), b.get(i)) for i in sorted(set(a) | set(b)) if a.get(i) != b.get(i))
    with pytest.raises(ValueError) as err:
        hf.check_same_vocab(llama_tok, tok)
    assert str(first) in str(err.value) and f"has {len(a)} tokens" in str(err.value)

    # Two ids swapped in an otherwise identical tokenizer: exactly those two are reported.
    src = ckpts["qwen2"][1]
    spec = json.loads((src / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    x, y = b[300], b[310]
    vocab[x], vocab[y] = vocab[y], vocab[x]
    swapped_dir = tmp_path / "swapped"
    shutil.copytree(src, swapped_dir)
    (swapped_dir / "tokenizer.json").write_text(json.dumps(spec))
    swapped = hf.load_tokenizer(swapped_dir)
    lo, hi = sorted((vocab[x], vocab[y]))
    with pytest.raises(ValueError, match="2 ids differ") as err:
        hf.check_same_vocab(tok, swapped, names=("teacher", "student"))
    assert f"({lo}, '{b[lo]}', '{b[hi]}')" in str(err.value)


def test_shared_vocab_size_cuts_embedding_padding(loaded):
    teacher, student, tok, _ = loaded["qwen2"]
    rows = (teacher.get_output_embeddings().weight.shape[0], student.get_output_embeddings().weight.shape[0])
    assert rows == (len(tok) + 24, len(tok) + 8)  # padded differently, like Qwen2.5-7B vs 1.5B
    assert hf.shared_vocab_size(tok, teacher, student) == len(tok)

    class Short(torch.nn.Module):
        def get_output_embeddings(self):
            return torch.nn.Linear(4, len(tok) - 1)

    with pytest.raises(ValueError, match="fewer than the tokenizer"):
        hf.shared_vocab_size(tok, Short())


def test_stop_and_pad_ids(loaded):
    _, student, tok, _ = loaded["llama"]
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert tok.pad_token_id is None and hf.pad_id_of(tok) == tok.eos_token_id
    assert hf.stop_ids(tok, student) == sorted({tok.eos_token_id, eot})
    _, qstudent, qtok, _ = loaded["qwen2"]
    assert hf.pad_id_of(qtok) == qtok.convert_tokens_to_ids("<|endoftext|>")
    assert hf.stop_ids(qtok) == [qtok.convert_tokens_to_ids("<|im_end|>")]


def test_render_and_encode_prompts(loaded):
    qtok, ltok = loaded["qwen2"][2], loaded["llama"][2]
    q, l_ = HFCodec.of(qtok), HFCodec.of(ltok)
    text = "Which drug?\nA. x\nB. y"
    assert q.render(text) == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    assert q.render(text, system="Be brief.").startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert l_.render(text) == text  # no chat template: the raw text
    q_ids = q.prompt(text)
    assert q_ids == qtok(q.render(text), add_special_tokens=False)["input_ids"]
    assert q_ids[0] == qtok.convert_tokens_to_ids("<|im_start|>") and qtok.decode(q_ids) == q.render(text)
    l_ids = l_.prompt(text)
    assert l_ids[0] == ltok.bos_token_id and l_ids.count(ltok.bos_token_id) == 1
    assert ltok.decode(l_ids, skip_special_tokens=True) == text
    assert q.completion("B")[-1] == qtok.convert_tokens_to_ids("<|im_end|>")
    assert q.decode(q.completion("the answer is B") + [5, 6]) == "the answer is B"  # stops at the stop id
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        HFCodec.of(ltok, max_prompt_tokens=3).prompt(text)


# --------------------------------------------------------------------------------------------
# Sampling: kdlab's one sampler (kdlab.engine.rollout.sample) with real pad / stop ids and vocabularies
# --------------------------------------------------------------------------------------------

PROMPTS = ["What is the most likely diagnosis?", "Solve for x: 2x = 6.", "fever"]


def _greedy_reference(model, prompt: list[int], n: int, vocab: int) -> list[int]:
    """No cache, no padding: full forward passes, argmax over the real vocabulary."""
    ids = list(prompt)
    out = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1, :vocab]
        out.append(int(logits.argmax()))
        ids.append(out[-1])
    return out


def _encode(tok, texts, system=None):
    codec = HFCodec.of(tok)
    return [codec.prompt(t, system) for t in texts]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-decoder", "generic-decoder"])
@pytest.mark.parametrize("family", FAMILIES)
def test_sample_greedy_matches_uncached_reference_and_stops(family, fast, loaded, monkeypatch):
    teacher, student, tok, _ = loaded[family]
    if not fast:  # the generic KV-cached decoder (any causal LM, any device)
        monkeypatch.setattr(rollout, "_fast_decoding_supported", lambda m: False)
    vocab = hf.shared_vocab_size(tok, teacher, student)
    prompts = _encode(tok, PROMPTS)
    assert len({len(p) for p in prompts}) == 3  # different lengths: left padding is exercised
    refs = [_greedy_reference(student, p, 8, vocab) for p in prompts]
    never = len(tok) + 5  # an id no model can emit: nothing stops
    ro = rollout.sample(student, prompts, 8, lam=1.0, pad_id=hf.pad_id_of(tok), eos_id=never, vocab_size=vocab,
                        greedy=True)
    assert ro.token_lists() == refs and bool(ro.mask.all())
    # Stopping on a chosen id: row 0 stops at its 3rd token (kept), later columns are pad and masked out.
    stop = refs[0][2]
    ro = rollout.sample(student, prompts, 8, lam=1.0, pad_id=hf.pad_id_of(tok), eos_id=[never, stop],
                        vocab_size=vocab, greedy=True)
    k = refs[0].index(stop)
    assert ro.token_lists()[0] == refs[0][:k + 1]
    assert (ro.tokens[0, k + 1:] == hf.pad_id_of(tok)).all() and not ro.mask[0, k + 1:].any()
    assert (ro.entropy[0, k + 1:] == 0).all()


def test_sample_matches_transformers_generate_for_llama(loaded):
    """Llama has no embedding padding, so HF generate's argmax is over the same ids."""
    _, student, tok, _ = loaded["llama"]
    codec = HFCodec.of(tok, student)
    for ids in _encode(tok, PROMPTS):
        t = torch.tensor([ids])
        ref = student.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=6, do_sample=False,
                               eos_token_id=list(codec.stop_ids), pad_token_id=codec.pad_id)
        ref = ref[0, len(ids):].tolist()
        ro = rollout.sample(student, [ids], 6, lam=1.0, codec=codec, greedy=True)
        assert ro.token_lists()[0] == ref[:len(ro.token_lists()[0])]


@pytest.mark.parametrize("family", FAMILIES)
def test_sample_mixture_first_step_and_endpoints(family, loaded):
    teacher, student, tok, _ = loaded[family]
    codec = HFCodec.of(tok, teacher, student)
    vocab = codec.vocab_size
    prompts = _encode(tok, PROMPTS)
    ro = rollout.sample(student, prompts, 1, lam=0.5, teacher=teacher, greedy=True, logratio_clip=2.0,
                        plausibility_alpha=0.1, codec=codec)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            s = student(input_ids=torch.tensor([p])).logits[0, -1, :vocab]
            t = teacher(input_ids=torch.tensor([p])).logits[0, -1, :vocab]
        mix = mixture_logprobs(s, t, 0.5, logratio_clip=2.0, plausibility_alpha=0.1)
        assert int(ro.tokens[i, 0]) == int(mix.argmax())
    # lam = -1 samples the teacher alone: the same draws as the teacher passed as "student".
    a = rollout.sample(None, prompts, 6, lam=-1.0, teacher=teacher, generator=torch.Generator().manual_seed(3),
                       codec=codec)
    b = rollout.sample(teacher, prompts, 6, lam=1.0, generator=torch.Generator().manual_seed(3), codec=codec)
    assert torch.equal(a.tokens, b.tokens) and int(a.tokens.max()) < vocab


# --------------------------------------------------------------------------------------------
# Distillation: kdlab's one loop (kdlab.engine.distill.distill) on real checkpoints
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_kd_loss_matches_unbatched_reference(family, loaded):
    """Batched, padded KL (teacher sees its own prompts) == a per-row computation by hand."""
    teacher, student, tok, _ = loaded[family]
    codec = HFCodec.of(tok, teacher, student)
    vocab = codec.vocab_size
    s_prompts = _encode(tok, PROMPTS)
    t_prompts = _encode(tok, PROMPTS, system="Answer in Spanish.")
    ro = rollout.sample(None, s_prompts, 6, lam=-1.0, teacher=teacher, teacher_prompts=t_prompts, codec=codec,
                        generator=torch.Generator().manual_seed(0))
    responses = ro.token_lists()
    responses[1] = responses[1][:3]  # ragged responses: right padding is exercised
    sp, spm = pad_left(s_prompts, codec.pad_id)
    tp_, tpm = pad_left(t_prompts, codec.pad_id)
    r, rm = pad_right(responses, pad_id=codec.pad_id)
    with torch.no_grad():
        s = response_logits(student, sp, spm, r, rm, vocab)
        t = response_logits(teacher, tp_, tpm, r, rm, vocab)
    assert s.shape == (3, r.shape[1], vocab)
    got = kl_loss(s, t, "forward", rm)
    total, count = 0.0, 0
    for p_s, p_t, resp in zip(s_prompts, t_prompts, responses):
        with torch.no_grad():
            ls = torch.log_softmax(student(input_ids=torch.tensor([p_s + resp])).logits[0, len(p_s) - 1:-1, :vocab], -1)
            lt = torch.log_softmax(teacher(input_ids=torch.tensor([p_t + resp])).logits[0, len(p_t) - 1:-1, :vocab], -1)
        total += float((lt.exp() * (lt - ls)).sum())
        count += len(resp)
    assert got.item() == pytest.approx(total / count, rel=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_full_path_offpd_and_onpd_runs(family, ckpts, tmp_path):
    t_dir, s_dir = ckpts[family]
    teacher, t_tok = hf.load_pretrained(t_dir, "bf16", "cpu")
    student, tok = hf.load_pretrained(s_dir, "bf16", "cpu")
    hf.check_same_vocab(t_tok, tok, names=("teacher", "student"))
    codec = HFCodec.of(tok, teacher, student)
    task = ChoiceTask(write_synthetic_choice(tmp_path / "train.jsonl"), max_new_tokens=8)
    pool = ProblemPool(task, "train", 16, seed=0)
    before = {k: v.clone() for k, v in student.state_dict().items()}

    # OffPD: teacher rollouts sampled once, then forward-KL steps on them.
    offpd = offpd_rollouts(teacher, task, pool, 8, 1.0, seed=0, max_new_tokens=8, codec=codec)
    assert all(0 < len(r) <= 8 and max(r) < codec.vocab_size for r in offpd[1])
    cfg = RunConfig(task=task.name, policy="off", kl="forward", lr=1e-2, seed=0, steps=5, batch_size=4, offpd_pool=8)
    off = distill(student, teacher, task, cfg, offpd=offpd, codec=codec, progress=False).history
    assert off[0]["loss"] > 0 and off[0]["grad_norm"] > 0
    assert off[0]["forward_kl"] == pytest.approx(off[0]["loss"], rel=2e-2)
    assert next(student.parameters()).dtype == torch.bfloat16  # no fp32 master copy
    assert sum(not torch.equal(before[k], v) for k, v in student.state_dict().items()) > 0

    # OnPD: the student samples, the teacher scores; reverse-KL steps in micro-batches of one row.
    cfg = RunConfig(task=task.name, policy="on", kl="reverse", lr=1e-2, seed=0, steps=2, batch_size=4, micro_batch_size=1)
    on = distill(student, teacher, task, cfg, pool=pool, codec=codec, progress=False).history
    assert on[0]["loss"] > 0 and on[0]["loss"] == pytest.approx(on[0]["reverse_kl"], rel=2e-2)


def test_micro_batches_give_the_whole_batch_update(ckpts, tmp_path):
    """Gradient accumulation with token-share weights == one pass over the whole batch (fp32)."""
    t_dir, s_dir = ckpts["qwen2"]
    task = ChoiceTask(write_synthetic_choice(tmp_path / "train.jsonl"), max_new_tokens=6)
    pool = ProblemPool(task, "train", 16, seed=0)
    runs, offpd = {}, None
    for mb in (0, 1, 4):
        teacher, tok = hf.load_pretrained(t_dir, "fp32", "cpu")
        student, _ = hf.load_pretrained(s_dir, "fp32", "cpu")
        codec = HFCodec.of(tok, teacher, student)
        if offpd is None:  # teacher responses cut to 1..6 tokens: ragged rows, unequal token shares
            problems, responses = offpd_rollouts(teacher, task, pool, 12, 1.0, seed=0, max_new_tokens=6, codec=codec)
            offpd = (problems, [r[:1 + i % 6] for i, r in enumerate(responses)])
        cfg = RunConfig(task=task.name, policy="off", kl="forward", lr=1e-3, seed=0, steps=2, batch_size=6, dtype="fp32",
                        offpd_pool=12, micro_batch_size=mb, kl_chunk_size=5 if mb == 4 else 0)
        hist = distill(student, teacher, task, cfg, offpd=offpd, codec=codec, progress=False).history
        runs[mb] = (hist, {k: v.clone() for k, v in student.state_dict().items()})
    ref_hist, ref_state = runs[0]
    assert any(h["length"] < 6 for h in ref_hist)  # ragged: token weights matter
    for mb in (1, 4):
        hist, state = runs[mb]
        for a, b in zip(hist, ref_hist):
            for key in ("loss", "forward_kl", "grad_norm", "length"):
                assert a[key] == pytest.approx(b[key], rel=1e-4), (mb, key)
        assert max(float((state[k] - ref_state[k]).abs().max()) for k in state) < 1e-5


def test_evaluation_on_medqa_rows_with_graders(loaded, medqa):
    _, student, tok, _ = loaded["qwen2"]
    codec = HFCodec.of(tok, student, eval_batch_size=3)
    problems = medqa.problems("test", 4, seed=0)
    texts = complete(student, [p.prompt for p in problems], 6, codec=codec)
    assert len(texts) == 4 and all(isinstance(t, str) for t in texts)
    expected = sum(grade_choice(t, p.data["options"], p.data["answer_idx"]) for p, t in zip(problems, texts)) / 4
    assert accuracy(student, medqa, problems, codec=codec, max_new_tokens=6) == expected
    # Batching and length sorting do not change greedy completions.
    assert complete(student, [p.prompt for p in problems], 6, codec=codec, batch_size=1) == texts


# --------------------------------------------------------------------------------------------
# Real tasks from local files
# --------------------------------------------------------------------------------------------

def test_medqa_rows_render_and_references_grade(medqa):
    assert medqa.capacity("test") == 1273 and medqa.capacity("train") == 0
    for p in medqa.all_problems:
        d = p.data
        assert p.prompt.startswith(d["question"]) and p.prompt.endswith(medqa.instruction)
        assert all(f"\n{k}. {v}" in p.prompt for k, v in d["options"].items())
        assert medqa.score(p, medqa.reference(p)) == 1.0
        wrong = next(k for k in d["options"] if k != d["answer_idx"])
        assert medqa.score(p, f"The answer is {wrong}.") == 0.0


def test_math500_references_grade():
    task = MathTask(need(MATH500), fractions=EVAL_ONLY)
    assert len(task.all_problems) == 500 and task.n_skipped == 0
    assert all(task.score(p, task.reference(p)) == 1.0 for p in task.all_problems)
    ints = [p for p in task.all_problems if p.data["answer"].lstrip("-").isdigit()]
    assert len(ints) > 100
    assert not any(task.score(p, f"\\boxed{{{int(p.data['answer']) + 1}}}") for p in ints)
    p = task.all_problems[0]
    assert p.prompt == f"{p.data['problem']}\n\n{task.instruction}" and "\\boxed{}" in task.instruction


def test_splits_are_stable_partitions_by_content(tmp_path):
    src = need(MEDQA)
    lines = src.read_text().splitlines()[:300]
    a_path, b_path = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a_path.write_text("\n".join(lines) + "\n")
    b_path.write_text("\n".join(reversed(lines)) + "\n")  # the same rows, reordered
    a, b = ChoiceTask(a_path), ChoiceTask(b_path)
    splits = {}
    for s in ("train", "validation", "test"):
        keys_a = {p.key for p in a.problems(s, 10_000)}
        assert keys_a == {p.key for p in b.problems(s, 10_000)}
        assert all(split_of(k) == s for k in keys_a)
        splits[s] = keys_a
    assert sum(map(len, splits.values())) == len(a.all_problems) == 300
    assert 200 < len(splits["train"]) < 280
    # problems(): deterministic in the seed, distinct, at most what exists.
    assert a.problems("train", 20, seed=1) == a.problems("train", 20, seed=1) != a.problems("train", 20, seed=2)
    assert len({p.key for p in a.problems("train", 20, seed=1)}) == 20
    with pytest.raises(ValueError, match="split"):
        a.problems("dev", 3)
    with pytest.raises(ValueError, match="count"):
        a.problems("train", -1)


def test_row_formats_parquet_and_errors(tmp_path):
    import pandas as pd

    rows = [{"question": "Q1?", "options": ["red", "blue", "green"], "answer": "blue", "explanation": "Sky."},
            {"question": "Q2?", "options": "A. one\nB) two\n(C) three", "answer": "c"},
            {"question": "Q2?", "options": "A. one\nB) two\n(C) three", "answer": "c"}]  # duplicate row
    jl = tmp_path / "mc.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = ChoiceTask(jl, fractions=EVAL_ONLY, instruction="")
    assert len(task.all_problems) == 2
    p1, p2 = task.all_problems
    assert p1.data["options"] == {"A": "red", "B": "blue", "C": "green"} and p1.data["answer_idx"] == "B"
    assert task.reference(p1) == "Sky.\n\nThe answer is B." and p1.prompt == "Q1?\n\nA. red\nB. blue\nC. green"
    assert p2.data["answer_idx"] == "C" and task.score(p2, "so the answer is (C)") == 1.0
    pq = tmp_path / "mc.parquet"  # options as a struct column, as datasets writes MedQA-style rows
    pd.DataFrame([{"question": "Q3?", "options": {"A": "x", "B": "y"}, "answer_idx": "B"}]).to_parquet(pq)
    (p3,) = ChoiceTask(pq, fractions=EVAL_ONLY).all_problems
    assert p3.data["options"] == {"A": "x", "B": "y"} and read_rows(pq, limit=1)[0]["answer_idx"] == "B"
    maths = tmp_path / "m.parquet"
    pd.DataFrame([{"problem": "1+1?", "solution": "It is $\\boxed{2}$."},
                  {"problem": "No answer here", "solution": "We cannot say."}]).to_parquet(maths)
    m = MathTask(maths, fractions=EVAL_ONLY)
    assert m.n_skipped == 1 and m.all_problems[0].data["answer"] == "2"
    assert m.reference(m.all_problems[0]) == "It is $\\boxed{2}$." and m.score(m.all_problems[0], "\\boxed{2}") == 1.0
    assert parse_options({"A": "x", "B": None, "C": "z"}, "w") == {"A": "x", "C": "z"}

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "Q", "options": {"A": "x", "B": "y"}, "answer_idx": "E"}) + "\n")
    with pytest.raises(ValueError, match="answer_idx 'E'"):
        ChoiceTask(bad)
    bad2 = tmp_path / "bad2.jsonl"  # a new file: the datasets cache keys on path, size and mtime
    bad2.write_text(json.dumps({"prompt": "Q", "options": {"A": "x", "B": "y"}, "answer_idx": "A"}) + "\n")
    with pytest.raises(ValueError, match=r"row 0: no non-empty field among \['question'\]"):
        ChoiceTask(bad2)
    (tmp_path / "x.csv").write_text("a\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        read_rows(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError):
        read_rows(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="fractions"):
        ChoiceTask(jl, fractions=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="kind"):
        real_task("essay", jl)


def test_load_benchmarks():
    specs = [{"kind": "choice", "path": str(need(MEDQA)), "name": "medqa", "limit": 20},
             {"kind": "math", "path": str(need(MATH500)), "limit": 10, "max_new_tokens": 512}]
    tasks = load_benchmarks(specs)
    assert [t.name for t in tasks] == ["medqa", "math500_test"]
    assert [t.capacity("test") for t in tasks] == [20, 10] and tasks[1].max_new_tokens == 512
    with pytest.raises(ValueError, match="unique"):
        load_benchmarks([specs[0], specs[0]])
    with pytest.raises(ValueError, match="unknown key 'split'"):
        load_benchmarks([{**specs[0], "split": "test"}])
    with pytest.raises(ValueError, match="kind"):
        load_benchmarks([{"kind": "code", "path": specs[0]["path"]}])
    with pytest.raises(ValueError, match="non-empty list"):
        load_benchmarks([])
