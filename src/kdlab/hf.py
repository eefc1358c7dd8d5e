"""Real Hugging Face checkpoints (Llama, Qwen2, ...) from local directories, on CPU or GPU.

The toy path (``kdlab.models`` / ``kdlab.rollout``) assumes kdlab's character tokenizer: pad
id 0, one end-of-sequence id 2, tensors on the CPU. Real checkpoints differ on all three:
Llama-3 has no pad token and several stop tokens, Qwen2.5 pads its embedding matrix beyond the
tokenizer (the 7B and the 1.5B by different amounts), and training runs on a GPU. This module
is the paper-scale counterpart:

- ``load_pretrained``: model + tokenizer from a local directory, in a chosen dtype and device;
- ``check_same_vocab`` / ``shared_vocab_size``: teacher and student must agree token for token;
  logits are cut to the tokenizer's size so that embedding padding never enters a KL;
- ``render_prompt`` / ``encode_prompts``: chat template when the tokenizer has one;
- ``hf_sample``: pi_lambda rollouts with KV caches, arbitrary pad / stop ids, any device;
- ``make_batch`` / ``kd_logits`` / ``distill_step``: one full-vocabulary KL step;
- ``hf_complete`` / ``hf_accuracy`` / ``hf_pass_at_ks`` / ``evaluate_benchmarks`` /
  ``forgetting``: generation + rule-based graders (``kdlab.tasks.real``).

Token-id conventions match kdlab's: prompts left-padded, responses right-padded, a response
mask that is True up to and including the first stop token.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .batching import pad_left, pad_right, positions
from .kl import kl_loss, token_kl
from .rollout import Rollout, next_token
from .tasks.base import Problem, Task

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

def pick_device() -> str:
    """"cuda" when a CUDA device is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from "bf16" / "fp16" / "fp32" (or a torch.dtype, returned as is)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)} or a torch.dtype, got {dtype!r}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> ``pick_device()``; anything else must be a valid torch device string."""
    if device == "auto":
        return torch.device(pick_device())
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available")
    return dev


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a checkpoint directory, set to pad on the left."""
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.padding_side = "left"
    return tok


def load_pretrained(path: str | Path, dtype: str | torch.dtype = "bf16", device: str | torch.device = "auto",
                    gradient_checkpointing: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local HF checkpoint directory.

    The model comes back in eval mode on ``device`` with parameters in ``dtype`` (no fp32 master
    copy: bf16 training then loses updates smaller than one bf16 step, as in the paper).
    ``gradient_checkpointing`` trades compute for activation memory during training.
    """
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"path {str(path)!r} is not a Hugging Face checkpoint directory (no config.json)")
    torch_dtype = resolve_dtype(dtype)
    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    model.to(dev)
    if gradient_checkpointing:  # transformers 5.x renamed it; 4.x has only the old name
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False  # training forward passes; sampling passes use_cache explicitly
    return model.eval(), load_tokenizer(path)


# --------------------------------------------------------------------------------------------
# Vocabulary and special tokens
# --------------------------------------------------------------------------------------------

def _id_to_token(tok: PreTrainedTokenizerBase) -> dict[int, str]:
    return {i: t for t, i in tok.get_vocab().items()}


def check_same_vocab(tok_a: PreTrainedTokenizerBase, tok_b: PreTrainedTokenizerBase,
                     names: tuple[str, str] = ("tok_a", "tok_b"), show: int = 5) -> None:
    """Raise ValueError unless the two tokenizers map every id to the same token string.

    Distillation compares the two models' distributions id by id over the full vocabulary, so
    this must hold exactly (added and special tokens included). The message names the sizes and
    the first ``show`` mismatches as (id, token_a, token_b), with None for an absent id.
    """
    a, b = _id_to_token(tok_a), _id_to_token(tok_b)
    if a == b:
        return
    mismatches = [(i, a.get(i), b.get(i)) for i in sorted(set(a) | set(b)) if a.get(i) != b.get(i)]
    raise ValueError(
        f"vocabularies differ: {names[0]} has {len(a)} tokens, {names[1]} has {len(b)}; "
        f"{len(mismatches)} ids differ, first (id, {names[0]}, {names[1]}): {mismatches[:show]}")


def shared_vocab_size(tokenizer: PreTrainedTokenizerBase, *models: torch.nn.Module) -> int:
    """``len(tokenizer)``, after checking every model's output layer covers it.

    Checkpoints may pad the embedding matrix beyond the tokenizer (Qwen2.5-7B: 152064 rows,
    Qwen2.5-1.5B: 151936, tokenizer: 151665). The padding rows are never real tokens, so logits
    are cut to this size before mixing or comparing distributions.
    """
    size = len(tokenizer)
    for m in models:
        rows = m.get_output_embeddings().weight.shape[0]
        if rows < size:
            raise ValueError(f"model {type(m).__name__} has {rows} output rows, fewer than the tokenizer's {size} tokens")
    return size


def stop_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module | None = None) -> list[int]:
    """Every id that ends a response: the tokenizer's eos plus the model's generation-config
    eos ids (Llama-3 instruct stops on both <|eot_id|> and <|end_of_text|>). Sorted, unique."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None) if model is not None else None
    extra = getattr(gen, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif extra is not None:
        ids.update(int(i) for i in extra)
    if not ids:
        raise ValueError("tokenizer has no eos_token_id and the model's generation config names none")
    return sorted(ids)


def pad_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id used for padding: the tokenizer's pad token, else its eos (Llama-3 has no pad).
    Padding is always masked out, so only its being a valid id matters."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("tokenizer has neither a pad_token_id nor an eos_token_id to pad with")


# --------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------

def render_prompt(tokenizer: PreTrainedTokenizerBase, text: str, system: str | None = None) -> str:
    """The text the model sees: the chat template applied to one user turn (plus an optional
    system turn) with the generation prompt, when the tokenizer has a template; else ``text``
    (with ``system`` and a blank line in front, if given)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {text!r}")
    if getattr(tokenizer, "chat_template", None):
        turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return f"{system}\n\n{text}" if system else text


def encode_prompts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], system: str | None = None,
                   max_tokens: int | None = None) -> list[list[int]]:
    """Token ids of the rendered prompts (see ``render_prompt``).

    A chat template already writes its special tokens (e.g. <|begin_of_text|>) as text, so they
    are not added a second time; raw prompts get the tokenizer's usual specials (Llama's BOS).
    ``max_tokens``: raise ValueError for a prompt longer than this rather than truncate it.
    """
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of strings, got a single str")
    templated = bool(getattr(tokenizer, "chat_template", None))
    out: list[list[int]] = []
    for i, text in enumerate(texts):
        ids = tokenizer(render_prompt(tokenizer, text, system), add_special_tokens=not templated)["input_ids"]
        if not ids:
            raise ValueError(f"texts[{i}] encodes to no tokens")
        if max_tokens is not None and len(ids) > max_tokens:
            raise ValueError(f"texts[{i}] is {len(ids)} tokens long, more than max_tokens={max_tokens}")
        out.append(list(ids))
    return out


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------

def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def padded_left(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids left-padded with ``pad_id`` and the (B, P) bool mask, on ``device``."""
    ids, mask = pad_left([list(s) for s in seqs])
    return ids.masked_fill(~mask, pad_id).to(device), mask.to(device)


def padded_right(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str,
                 width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, R) ids right-padded with ``pad_id`` and the (B, R) bool mask, on ``device``."""
    ids, mask = pad_right([list(s) for s in seqs], width)
    return ids.masked_fill(~mask, pad_id).to(device), mask.to(device)


class _KVStepper:
    """One model, its own left-padded prompts and KV cache, fed one shared token per step."""

    def __init__(self, model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_id: int, vocab_size: int):
        params = inspect.signature(model.forward).parameters
        self.model, self.vocab_size = model, vocab_size
        self.kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5 says "cache"
        extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}  # no (B, P, V) prefill logits
        ids, self.mask = padded_left(prompts, pad_id, model_device(model))
        out = model(input_ids=ids, attention_mask=self.mask.long(), position_ids=positions(self.mask),
                    use_cache=True, **extra)
        self.cache = getattr(out, self.kw)
        self.last = out.logits[:, -1, :vocab_size].float()  # (B, V)
        self.next_pos = self.mask.sum(-1, keepdim=True)  # (B, 1)

    def feed(self, tok: torch.Tensor) -> None:  # tok: (B,)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask.long(), position_ids=self.next_pos,
                         use_cache=True, **{self.kw: self.cache})
        self.cache = getattr(out, self.kw)
        self.last = out.logits[:, -1, :self.vocab_size].float()
        self.next_pos = self.next_pos + 1


@torch.no_grad()
def hf_sample(student: torch.nn.Module | None, teacher: torch.nn.Module | None, prompts: Sequence[Sequence[int]],
              max_new_tokens: int, lam: float = 1.0, *, pad_id: int, eos_id: int | Sequence[int],
              teacher_prompts: Sequence[Sequence[int]] | None = None, vocab_size: int | None = None,
              temperature: float = 1.0, greedy: bool = False, logratio_clip: float | None = None,
              plausibility_alpha: float | None = None, generator: torch.Generator | None = None,
              stop_early: bool = True) -> Rollout:
    """Sample one response per prompt under pi_lambda (lam=+1 student, -1 teacher, else the
    ``kdlab.mixture`` blend), with KV caches, on the models' device.

    Args:
        prompts: student prompt token ids (no padding); ``teacher_prompts`` default to them.
        pad_id: written after a row's stop token (masked out anyway).
        eos_id: one stop id or several (``stop_ids``); the stop token is kept in the response.
        vocab_size: logits are cut to this many ids (``shared_vocab_size``); default: the
            smaller of the two models' output sizes.
        generator: a torch.Generator on the models' device, or a CPU one (then each step's
            probabilities are copied to the CPU to draw from).
        stop_early: stop when every row has stopped. Set False under FSDP, where every rank must
            run the same number of forward passes.

    Returns:
        ``kdlab.rollout.Rollout`` on the CPU: tokens/mask/entropy (B, R), mask True up to and
        including the first stop token.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be > 0 (or use greedy=True), got {temperature}")
    if not prompts:
        raise ValueError("prompts is empty")
    need_s, need_t = lam != -1.0, lam != 1.0
    if need_s and student is None:
        raise ValueError(f"lam={lam} needs a student model")
    if need_t and teacher is None:
        raise ValueError(f"lam={lam} needs a teacher model")
    teacher_prompts = prompts if teacher_prompts is None else teacher_prompts
    if len(teacher_prompts) != len(prompts):
        raise ValueError(f"teacher_prompts has {len(teacher_prompts)} rows, prompts has {len(prompts)}")
    models = [m for m, need in ((student, need_s), (teacher, need_t)) if need]
    if vocab_size is None:
        vocab_size = min(m.get_output_embeddings().weight.shape[0] for m in models)
    device = model_device(models[0])
    eos = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), dtype=torch.long, device=device)
    s = _KVStepper(student, prompts, pad_id, vocab_size) if need_s else None
    t = _KVStepper(teacher, teacher_prompts, pad_id, vocab_size) if need_t else None
    temp = 1.0 if greedy else temperature
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    toks, ents, alive = [], [], []
    for step in range(max_new_tokens):
        tok, ent = next_token(s.last if s is not None else None, t.last if t is not None else None, lam, temp,
                              greedy=greedy, logratio_clip=logratio_clip, plausibility_alpha=plausibility_alpha,
                              stop_id=int(eos[0]), generator=generator)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        alive.append(~done)
        toks.append(tok)
        ents.append(torch.where(done, torch.zeros_like(ent), ent))
        done = done | torch.isin(tok, eos)
        if step == max_new_tokens - 1 or (stop_early and bool(done.all())):
            break
        for st in (s, t):
            if st is not None:
                st.feed(tok)
    return Rollout(tokens=torch.stack(toks, 1).cpu(), mask=torch.stack(alive, 1).cpu(),
                   entropy=torch.stack(ents, 1).cpu())


# --------------------------------------------------------------------------------------------
# Distillation step
# --------------------------------------------------------------------------------------------

@dataclass
class DistillBatch:
    """A distillation batch on one device. Prompts (B, P_s) / (B, P_t) left-padded, response
    (B, R) right-padded; masks are bool, response_mask True on the tokens that are trained."""

    student_prompt: torch.Tensor
    student_prompt_mask: torch.Tensor
    teacher_prompt: torch.Tensor
    teacher_prompt_mask: torch.Tensor
    response: torch.Tensor
    response_mask: torch.Tensor


def make_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, pad_id: int,
               device: torch.device | str, teacher_prompts: Sequence[Sequence[int]] | None = None) -> DistillBatch:
    """Pad prompt / response token lists into a ``DistillBatch`` on ``device``.
    ``responses`` are the sampled tokens up to and including the stop token
    (``Rollout.token_lists()``); an empty response contributes no trained position."""
    if len(prompts) != len(responses):
        raise ValueError(f"prompts has {len(prompts)} rows, responses has {len(responses)}")
    teacher_prompts = prompts if teacher_prompts is None else teacher_prompts
    if len(teacher_prompts) != len(prompts):
        raise ValueError(f"teacher_prompts has {len(teacher_prompts)} rows, prompts has {len(prompts)}")
    sp, spm = padded_left(prompts, pad_id, device)
    tp, tpm = padded_left(teacher_prompts, pad_id, device)
    r, rm = padded_right(responses, pad_id, device)
    return DistillBatch(sp, spm, tp, tpm, r, rm)


def _response_logits(model: torch.nn.Module, prompt: torch.Tensor, prompt_mask: torch.Tensor,
                     response: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, R, vocab_size) logits predicting each response token (same layout as
    ``kdlab.batching.response_logits``; the cut to ``vocab_size`` happens before the upcast)."""
    ids = torch.cat([prompt, response], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(response, dtype=torch.bool)], dim=1)
    width = prompt.shape[1]
    out = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask), use_cache=False)
    return out.logits[:, width - 1: width - 1 + response.shape[1], :vocab_size]


def kd_logits(student: torch.nn.Module, teacher: torch.nn.Module, batch: DistillBatch,
              vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Student logits (with grad) and teacher logits (no grad), both (B, R, vocab_size)."""
    with torch.no_grad():
        t = _response_logits(teacher, batch.teacher_prompt, batch.teacher_prompt_mask, batch.response, vocab_size)
    s = _response_logits(student, batch.student_prompt, batch.student_prompt_mask, batch.response, vocab_size)
    return s, t


def distill_step(student: torch.nn.Module, teacher: torch.nn.Module, batch: DistillBatch,
                 optimizer: torch.optim.Optimizer, kind: str = "forward", *, vocab_size: int,
                 grad_clip: float | None = 1.0, beta: float = 0.5, sample_direction: str = "reverse",
                 chunk_size: int | None = None) -> dict[str, float]:
    """One optimiser step on ``kdlab.kl.kl_loss`` over the response positions of ``batch``.

    Returns loss, grad_norm (before clipping), and the token-mean forward / reverse KL of the
    batch (nats per token). A non-finite loss skips the update and is returned as is.
    One process; ``kdlab.fsdp_run`` has the multi-process version (global token mean,
    micro-batches, a skip decision taken by all ranks together).
    """
    student.train()
    s, t = kd_logits(student, teacher, batch, vocab_size)
    mask = batch.response_mask
    loss = kl_loss(s, t, kind, mask, beta=beta, tokens=batch.response, sample_direction=sample_direction,
                   chunk_size=chunk_size)
    optimizer.zero_grad(set_to_none=True)
    value = float(loss.detach())
    if not math.isfinite(value):
        student.eval()
        return {"loss": value, "grad_norm": float("nan"), "forward_kl": float("nan"), "reverse_kl": float("nan")}
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(student.parameters(), grad_clip if grad_clip is not None else math.inf)
    if hasattr(gnorm, "full_tensor"):  # a DTensor under FSDP2
        gnorm = gnorm.full_tensor()
    optimizer.step()
    student.eval()
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        fkl = float(token_kl(s.detach(), t, "forward", mask).sum() / n)
        rkl = float(token_kl(s.detach(), t, "reverse", mask).sum() / n)
    return {"loss": value, "grad_norm": float(gnorm), "forward_kl": fkl, "reverse_kl": rkl}


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------

@torch.no_grad()
def hf_complete(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                max_new_tokens: int, *, greedy: bool = True, temperature: float = 1.0, batch_size: int = 8,
                generator: torch.Generator | None = None, system: str | None = None) -> list[str]:
    """Completions of ``texts`` (rendered with ``render_prompt``), decoded without special tokens,
    in input order. Prompts are batched by length to keep padding small."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ids = encode_prompts(tokenizer, texts, system)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    pad, eos = pad_id_of(tokenizer), stop_ids(tokenizer, model)
    vocab = shared_vocab_size(tokenizer, model)
    out: list[str] = [""] * len(ids)
    model.eval()
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ro = hf_sample(model, None, [ids[i] for i in chunk], max_new_tokens, 1.0, pad_id=pad, eos_id=eos,
                       vocab_size=vocab, greedy=greedy, temperature=temperature, generator=generator)
        for i, row in zip(chunk, ro.token_lists()):
            out[i] = tokenizer.decode(row, skip_special_tokens=True)
    return out


def hf_accuracy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, task: Task, problems: Sequence[Problem],
                *, max_new_tokens: int | None = None, batch_size: int = 8) -> float:
    """Greedy pass@1: the share of ``problems`` whose completion ``task.score`` accepts."""
    if not problems:
        raise ValueError(f"problems is empty (task {task.name!r})")
    texts = hf_complete(model, tokenizer, [p.prompt for p in problems], max_new_tokens or task.max_new_tokens,
                        batch_size=batch_size)
    return sum(task.score(p, c) for p, c in zip(problems, texts)) / len(problems)


def hf_pass_at_ks(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, task: Task,
                  problems: Sequence[Problem], n: int, ks: Sequence[int] = (1, 10), *, temperature: float = 1.0,
                  seed: int = 0, max_new_tokens: int | None = None, batch_size: int = 8) -> dict[int, float]:
    """Mean unbiased pass@k over ``problems`` from ``n`` temperature samples each
    (``kdlab.metrics.pass_at_k``). The generator lives on the CPU, so the draws are the same on
    any device up to floating-point differences in the logits."""
    from .metrics import pass_at_k

    if not problems:
        raise ValueError(f"problems is empty (task {task.name!r})")
    if any(k > n for k in ks):
        raise ValueError(f"every k in {tuple(ks)} must be <= n={n}")
    gen = torch.Generator().manual_seed(seed)
    texts = hf_complete(model, tokenizer, [p.prompt for p in problems for _ in range(n)],
                        max_new_tokens or task.max_new_tokens, greedy=False, temperature=temperature,
                        batch_size=batch_size, generator=gen)
    out = {k: 0.0 for k in ks}
    for i, prob in enumerate(problems):
        c = int(sum(task.score(prob, t) for t in texts[i * n:(i + 1) * n]))
        for k in ks:
            out[k] += pass_at_k(n, c, k) / len(problems)
    return out


def evaluate_benchmarks(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[Task],
                        n: int | None = None, *, seed: int = 0, max_new_tokens: int | None = None,
                        batch_size: int = 8) -> dict[str, float]:
    """Greedy accuracy on each benchmark (``kdlab.tasks.real.load_benchmarks``), on its first
    ``n`` test problems drawn with ``seed`` (all when None), plus ``benchmark_mean``.
    Forgetting is ``forgetting(before, after)`` of two such dicts."""
    if not tasks:
        raise ValueError("tasks is empty: list at least one benchmark")
    scores: dict[str, float] = {}
    for task in tasks:
        count = task.capacity("test") if n is None else n
        if count is None:
            raise ValueError(f"task {task.name!r} has an unbounded test split: pass n")
        problems = task.problems("test", count, seed=seed)
        scores[task.name] = hf_accuracy(model, tokenizer, task, problems, max_new_tokens=max_new_tokens,
                                        batch_size=batch_size)
    scores["benchmark_mean"] = sum(scores.values()) / len(scores)
    return scores


def forgetting(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Change of the mean benchmark score (after - before; negative = forgot)."""
    for name, d in (("before", before), ("after", after)):
        if "benchmark_mean" not in d:
            raise ValueError(f"{name} has no 'benchmark_mean' (use evaluate_benchmarks)")
    return float(after["benchmark_mean"]) - float(before["benchmark_mean"])
