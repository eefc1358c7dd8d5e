"""Tiny random Llama / Qwen2 checkpoints with real-looking byte-level BPE tokenizers, for tests.

The tokenizers are trained in a fraction of a second on generated sentences (never on the
shared evaluation data) and, being byte-level, encode any text exactly like Llama-3's and
Qwen2's. The "llama" one has a BOS post-processor, no pad token and no chat template; the
"qwen2" one has a ChatML chat template, pad <|endoftext|> and eos <|im_end|>. Qwen2 checkpoints
pad their embedding matrix beyond the tokenizer, by a different amount per size, as the real
Qwen2.5-7B / 1.5B do.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

WORDS = ("the patient doctor fever pain blood heart lung kidney liver drug dose answer option letter is was "
         "with of and to in a an which most likely following next step treatment diagnosis solve find number "
         "sum product equal value root fraction therefore so we have boxed").split()
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = {"llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
            "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
SIZES = {"teacher": dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=96),
         "student": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64)}
EMBED_PAD = {"llama": {"teacher": 0, "student": 0}, "qwen2": {"teacher": 24, "student": 8}}


def _corpus(n: int = 400):
    rng = random.Random(0)
    for _ in range(n):
        yield " ".join(rng.choice(WORDS) for _ in range(12)) + f" {rng.randint(0, 999)}."


def build_tokenizer(family: str, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS[family], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(_corpus(), trainer)
    if family == "llama":
        bos = "<|begin_of_text|>"
        core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, core.token_to_id(bos))])
        return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token="<|end_of_text|>")
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    return tok


def build_checkpoint(directory: Path, family: str, role: str, tokenizer: PreTrainedTokenizerFast,
                     seed: int = 0) -> Path:
    """A random ``family`` model of size ``role`` saved with ``tokenizer`` to ``directory``."""
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    eos = tokenizer.eos_token_id
    cfg = cfg_cls(vocab_size=len(tokenizer) + EMBED_PAD[family][role], max_position_embeddings=512,
                  tie_word_embeddings=(family == "qwen2"), bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                  pad_token_id=tokenizer.pad_token_id, **SIZES[role])
    torch.manual_seed(seed)
    model = model_cls(cfg)
    with torch.no_grad():  # larger logits than the default init, so the two models clearly differ
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    if family == "llama":  # Llama-3 instruct stops on two ids: the eos and <|eot_id|>
        gen = json.loads((directory / "generation_config.json").read_text())
        gen["eos_token_id"] = [eos, tokenizer.convert_tokens_to_ids("<|eot_id|>")]
        (directory / "generation_config.json").write_text(json.dumps(gen))
    return directory


def build_pair(root: Path, family: str) -> tuple[Path, Path]:
    """(teacher_dir, student_dir) sharing one tokenizer."""
    tok = build_tokenizer(family)
    teacher = build_checkpoint(root / f"{family}-teacher", family, "teacher", tok, seed=1)
    student = build_checkpoint(root / f"{family}-student", family, "student", tok, seed=2)
    return teacher, student


def write_synthetic_choice(path: Path, n: int = 40, seed: int = 0) -> Path:
    """Made-up 4-option questions (training data for tests; the shared files are eval-only)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        opts = {k: " ".join(rng.choice(WORDS) for _ in range(3)) + f" {i}{k}" for k in "ABCD"}
        rows.append({"question": f"Q{i}: " + " ".join(rng.choice(WORDS) for _ in range(8)) + "?",
                     "options": opts, "answer_idx": rng.choice("ABCD"),
                     "reasoning": " ".join(rng.choice(WORDS) for _ in range(10)) + "."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_synthetic_math(path: Path, n: int = 40, seed: int = 0) -> Path:
    """Made-up boxed-answer sums (training data for tests)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        rows.append({"problem": f"P{i}: what is the sum of {a} and {b}?",
                     "solution": f"We add {a} and {b}, so the sum is $\\boxed{{{a + b}}}$.", "answer": str(a + b)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_real_profile(root: Path, family: str = "qwen2", name: str = "hf-tiny", **grid) -> Path:
    """A pretrained-checkpoint profile on tiny random checkpoints (``build_pair``): one choice task
    and one math task from small made-up files, a made-up choice benchmark for forgetting, the
    2 x 2 x 2 grid with one seed and one lambda point. Returns the profile's path."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    teacher, student = build_pair(root, family)
    mc = write_synthetic_choice(root / "mc_train.jsonl", n=60, seed=1)
    arith = write_synthetic_math(root / "math_train.jsonl", n=60, seed=2)
    bench = write_synthetic_choice(root / "bench.jsonl", n=12, seed=3)
    profile = {
        "name": name,
        "pretrained": {
            "student": str(student),
            "tasks": [{"name": "mc", "kind": "choice", "train": str(mc), "teacher": str(teacher), "max_new_tokens": 8},
                      {"name": "arith", "kind": "math", "train": str(arith), "teacher": str(teacher),
                       "max_new_tokens": 8}],
            "benchmarks": [{"kind": "choice", "path": str(bench), "name": "bench", "max_new_tokens": 6}],
            "n_benchmark": 6, "device": "cpu", "gradient_checkpointing": True, "micro_batch_size": 2,
        },
        "distill": {"steps": 2, "batch_size": 4, "offpd_pool": 8},
        "eval": {"n_test": 4, "pass_n": 2, "pass_problems": 2, "pass_ks": [1, 2]},
        "grid": {"tasks": ["mc", "arith"], "policies": ["off", "on"], "kls": ["forward", "reverse"],
                 "lrs": [1.0e-4, 5.0e-4], "seeds": [0], "lambdas": [0.0], "lambda_tasks": ["mc"], **grid},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path
