"""Batched sampling under the lambda-mixture rollout policy pi_lambda, with KV caches.

lam = +1 samples from the student alone (OnPD), lam = -1 from the teacher alone (OffPD), and
anything else steps both models together and samples from ``mixture_logprobs``. The teacher may
see a different prompt from the student (the style experiment); the sampled response tokens are
shared. Sequences stop at </s>; tokens after it are <pad> and masked out.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batching import pad_left, positions
from ..core.mixture import mixture_logprobs
from ..models.tokenizer import EOS_ID, PAD_ID


STOP_CHECK = 16  # decode steps between two checks for "every row has stopped" off the CPU
CUDA_GRAPHS = True  # decode steps on a GPU replayed as CUDA graphs (False: the same steps, launched one by one)


@dataclass
class Rollout:
    """Sampled responses. tokens/mask: (B, R); mask is True up to and including </s>.
    entropy: (B, R) float32 entropy (nats) of the sampling distribution at each step.
    teacher_logits: (B, R, V) float32, the teacher's logits at each step before its temperature
    (``sample(..., keep_teacher_logits=True)`` with a teacher in the mixture), on the models' device; else None."""

    tokens: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor
    teacher_logits: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    def token_lists(self) -> list[list[int]]:
        return [row[: int(n)].tolist() for row, n in zip(self.tokens, self.lengths)]


def next_token(student_last: torch.Tensor | None, teacher_last: torch.Tensor | None, lam: float, temp: float, *,
               greedy: bool, logratio_clip: float | None, plausibility_alpha: float | None, stop_id: int,
               generator: torch.Generator | None = None,
               teacher_temp: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sampling step of pi_lambda from the models' last logits (B, V) (None: model not used).

    ``temp`` divides the student's logits and ``teacher_temp`` the teacher's (default: ``temp``).
    Returns the chosen tokens (B,) and the entropy (B,) of the sampling distribution, in nats.
    A row whose log-probs are all non-finite (a diverged model) gets ``stop_id``.
    """
    t_temp = temp if teacher_temp is None else teacher_temp
    if teacher_last is None:
        logp = torch.log_softmax(student_last / temp, -1)
    elif student_last is None:
        logp = torch.log_softmax(teacher_last / t_temp, -1)
    else:
        logp = mixture_logprobs(student_last / temp, teacher_last / t_temp, lam, logratio_clip=logratio_clip,
                                plausibility_alpha=plausibility_alpha)
    # a diverged row samples the stop id; branch-free, so the decode loop never waits on the host
    bad = ~torch.isfinite(logp).any(-1, keepdim=True)  # (B, 1)
    stop_row = torch.full_like(logp[:1], -math.inf)
    # a stop id beyond the logits (one no model can emit) cannot end a diverged row: it gets id 0
    stop_row[:, stop_id if 0 <= stop_id < logp.shape[-1] else 0] = 0.0
    logp = torch.where(bad, stop_row, logp)
    p = logp.exp()
    ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
    if greedy:
        tok = logp.argmax(-1)
    elif generator is not None and generator.device != p.device:
        tok = torch.multinomial(p.to(generator.device), 1, generator=generator).squeeze(-1).to(p.device)
    else:
        tok = torch.multinomial(p, 1, generator=generator).squeeze(-1)
    return tok, ent


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.x names the KV-cache argument ``cache``; earlier ones ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Stepper:
    """One model with its own prompt and KV cache, fed one shared token per step (any HF causal LM,
    any device). ``last`` holds the float32 logits (B, V) cut to ``vocab_size``."""

    def __init__(self, model: torch.nn.Module, prompts: list[list[int]], pad_id: int = PAD_ID,
                 vocab_size: int | None = None):
        self.model, self.vocab_size = model, vocab_size
        self.kw = _cache_kwarg(model)
        params = inspect.signature(model.forward).parameters
        extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}  # no (B, P, V) prefill logits
        device = next(model.parameters()).device
        ids, mask = pad_left(prompts, pad_id)
        ids, self.mask = ids.to(device), mask.to(device)
        out = model(input_ids=ids, attention_mask=self.mask.long(), position_ids=positions(self.mask), use_cache=True,
                    **extra)
        self.cache = getattr(out, self.kw)
        self.last = out.logits[:, -1, :vocab_size].float()  # (B, V)
        self.next_pos = self.mask.sum(-1, keepdim=True)  # (B, 1)

    def feed(self, tok: torch.Tensor) -> None:  # tok (B,)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=tok[:, None].to(self.mask.device), attention_mask=self.mask.long(),
                         position_ids=self.next_pos, use_cache=True, **{self.kw: self.cache})
        self.cache = getattr(out, self.kw)
        self.last = out.logits[:, -1, :self.vocab_size].float()
        self.next_pos = self.next_pos + 1


_FAST_ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_FAST_DEVICES = ("cpu", "cuda")


def _fast_decoding_supported(model: torch.nn.Module) -> bool:
    """Whether ``_StaticStepper`` reproduces ``model``: a Llama / Qwen2 on a CPU or a CUDA GPU,
    without sliding window or attention dropout in effect, laid out as transformers builds them."""
    if type(model).__name__ not in _FAST_ARCHS:
        return False
    cfg, inner = model.config, getattr(model, "model", None)
    if getattr(cfg, "use_sliding_window", False) or (model.training and getattr(cfg, "attention_dropout", 0.0)):
        return False
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    layer = inner.layers[0]
    if not all(hasattr(layer.self_attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")):
        return False
    norms = (inner.norm, layer.input_layernorm, layer.post_attention_layernorm)
    if not all(hasattr(x, "weight") and hasattr(x, "variance_epsilon") for x in norms):
        return False
    first = next(model.parameters())
    return first.device.type in _FAST_DEVICES and isinstance(first, torch.nn.Parameter) and not hasattr(
        first, "full_tensor")  # not an FSDP shard (DTensor)


def _rotate_half_rows(w: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows of a projection ``w`` (heads * dim, ...) reordered so that ``w' x = rotate_half(w x)``
    per head (transformers' Llama rotary helper: (x1, x2) -> (-x2, x1)); exact (a signed
    permutation of rows)."""
    heads = w.shape[0] // dim
    half = dim // 2
    r = w.view(heads, dim, *w.shape[1:])
    return torch.cat((-r[:, half:], r[:, :half]), dim=1).reshape(w.shape)


class _StaticStepper:
    """``_Stepper`` for Llama / Qwen2 with a preallocated KV cache and a lean decode step.

    Uses the model's own weights, rotary embedding and activation, but runs the layers itself:
    keys/values go into preallocated (B * KV, P + N, D) buffers on the model's device, the
    padding mask is built once, the query/key/value projections run as one matmul (and the
    MLP's gate/up as another), the prompt pass computes the head only at the last position, and
    each step is one short loop over the layers with no per-call mask or cache objects. The
    arithmetic is transformers' (RMSNorm in float32, rotary embedding, softmax in float32 over
    scaled scores with masked keys at a large negative value). Attention, by ``sdpa``: on a CPU
    (False) the cached keys/values are kept, and the two attention matmuls run, in float32: the
    cached values are exact copies of the model-dtype ones and the result only skips two
    intermediate roundings to the model dtype (small batched bf16 matmuls are several times
    slower on CPU); on CUDA (True) the cache is in the model dtype (half the memory and traffic
    of float32 at bf16) and attention is ``scaled_dot_product_attention`` (the fused kernels),
    as transformers' own SDPA attention computes it.

    Two decode modes. ``static=False`` (the CPU's): step t attends to the first P + t columns
    (a Python slice; shapes change every step). ``static=True`` (CUDA's): every step has the
    same shapes, gpt-fast style: it attends over all P + N columns, the columns not yet written
    masked out by the key bias, and writes its key/value at a column held in a device tensor,
    so no step needs the host; with ``graph=True`` the step is captured once as a CUDA graph and
    each token is one replay. Both modes compute the same function (a masked column's weight is
    exactly 0 after the softmax).
    """

    def __init__(self, model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, pad_id: int = PAD_ID,
                 vocab_size: int | None = None, static: bool | None = None, graph: bool | None = None,
                 sdpa: bool | None = None):
        inner = model.model
        self.vocab_size = vocab_size
        self.embed, self.rope, self.head = inner.embed_tokens, inner.rotary_emb, model.lm_head
        self.norm = (inner.norm.weight, inner.norm.variance_epsilon)
        attn = inner.layers[0].self_attn
        self.dim, self.scaling = attn.head_dim, attn.scaling
        self.kv_heads = attn.k_proj.out_features // self.dim
        self.heads = attn.q_proj.out_features // self.dim
        self.layers = [self._fuse(layer, self.dim) for layer in inner.layers]
        device = self.embed.weight.device
        on_cuda = device.type == "cuda"
        self.static = on_cuda if static is None else static
        ids, mask = pad_left(prompts, pad_id)
        ids, mask = ids.to(device), mask.to(device)
        B, P = ids.shape
        self.dtype = self.embed.weight.dtype
        self.sdpa = on_cuda if sdpa is None else sdpa
        att = self.dtype if self.sdpa else torch.float32  # the cache's and the attention's dtype
        width = P + max_new_tokens
        rows = B * self.kv_heads  # one attention row per (sequence, key/value head)
        self.keys = [torch.zeros(rows, width, self.dim, device=device, dtype=att) for _ in self.layers]
        self.values = [torch.zeros_like(k) for k in self.keys]
        # masked keys at the dtype's most negative finite value: a query with no key (left padding
        # in the prompt pass) gets uniform weights, never NaN (-inf would make 0 x NaN downstream)
        neg = torch.finfo(att).min
        self.neg = neg
        # additive key mask per attention row (B * KV, 1, width): prompt padding is never attended;
        # in static mode the columns not yet written are masked too, and unmasked as they are
        unwritten = torch.ones if self.static else torch.zeros
        self.key_bias = torch.zeros(B, width, device=device, dtype=att).masked_fill_(
            torch.cat([~mask, unwritten(B, max_new_tokens, dtype=torch.bool, device=device)], 1), neg)
        self.key_bias = self.key_bias.repeat_interleave(self.kv_heads, 0)[:, None, :]
        self.length = 0
        g = self.heads // self.kv_heads
        causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
        allowed = mask[:, None, :] & causal  # (B, P queries, P keys)
        prompt_bias = torch.zeros(B, P, P, device=device, dtype=att).masked_fill_(~allowed, neg)
        prompt_bias = prompt_bias.repeat_interleave(self.kv_heads, 0).repeat(1, g, 1)  # (B * KV, g * P, P)
        self.last = self._run(ids, positions(mask), prompt_bias).float()
        self.next_pos = mask.sum(-1, keepdim=True)  # (B, 1)
        self.col = torch.full((1,), P, dtype=torch.long, device=device)  # the next column written (static)
        self.graph = None
        if graph is None:  # a real GPU (the CUDA stand-in of the tests computes on the CPU)
            graph = CUDA_GRAPHS and on_cuda and torch.cuda.is_available()
        if self.static and graph:
            self._capture()

    @staticmethod
    def _fuse(layer: torch.nn.Module, dim: int) -> tuple:
        """Per layer: (norm1, qkv (w, b), o_proj (w, b), norm2, gate+up (w, b), act, down (w, b)).

        Norms are (weight, eps). The fused projection yields [q, k, rotate_half(q),
        rotate_half(k), v] per position, so the rotary embedding is two multiplies and an add."""
        a, m = layer.self_attn, layer.mlp

        def cat(*mods, rotated=()):
            w = torch.cat([x.weight for x in mods] + [_rotate_half_rows(x.weight, dim) for x in rotated])
            if mods[0].bias is None:
                return w, None
            return w, torch.cat([x.bias for x in mods] + [_rotate_half_rows(x.bias, dim) for x in rotated])

        qk_w, qk_b = cat(a.q_proj, a.k_proj, rotated=(a.q_proj, a.k_proj))
        qkv = (torch.cat([qk_w, a.v_proj.weight]), None if qk_b is None else torch.cat([qk_b, a.v_proj.bias]))
        norm1 = (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        norm2 = (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        return (norm1, qkv, (a.o_proj.weight, a.o_proj.bias), norm2, cat(m.gate_proj, m.up_proj), m.act_fn,
                (m.down_proj.weight, m.down_proj.bias))

    def _rms(self, h: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
        """transformers' RMSNorm: normalise in float32, round to the model dtype, scale."""
        w, eps = norm
        return w * F.rms_norm(h.float(), (h.shape[-1],), eps=eps).to(self.dtype)

    def _run(self, ids: torch.Tensor, pos: torch.Tensor, bias: torch.Tensor, col: torch.Tensor | None = None
             ) -> torch.Tensor:
        """Feed ids (B, T) at positions pos (B, T) with additive key bias (B * KV, g * T or 1,
        keys); returns the last position's logits (B, V). ``col`` None: the T new keys go to
        columns length .. length + T and the first length + T columns are attended; ``col`` a
        (1,) device tensor (static mode, T = 1): the new key goes to that column and every
        column is attended (``bias`` masks the unwritten ones)."""
        B, T = ids.shape
        H, KV, D = self.heads, self.kv_heads, self.dim
        g, n = H // KV, H + KV
        start, end = self.length, self.length + T
        h = self.embed(ids)
        cos, sin = self.rope(h, pos)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, T, 1, D)
        for (norm1, qkv, o_proj, norm2, gate_up, act, down), kc, vc in zip(self.layers, self.keys, self.values):
            x = F.linear(self._rms(h, norm1), *qkv).view(B, T, 2 * n + KV, D)  # [q, k, rot q, rot k, v]
            qk = x[:, :, :n] * cos + x[:, :, n:2 * n] * sin  # (B, T, H + KV, D)
            k_new, v_new = qk[:, :, H:].transpose(1, 2), x[:, :, 2 * n:].transpose(1, 2)  # (B, KV, T, D)
            if col is None:
                kc.view(B, KV, -1, D)[:, :, start:end] = k_new
                vc.view(B, KV, -1, D)[:, :, start:end] = v_new
                keys, values = kc[:, :end], vc[:, :end]
            else:
                kc.view(B, KV, -1, D).index_copy_(2, col, k_new.to(kc.dtype))
                vc.view(B, KV, -1, D).index_copy_(2, col, v_new.to(vc.dtype))
                keys, values = kc, vc
            # the g query heads sharing one key/value head form one attention row: (B * KV, g * T, D)
            q = qk[:, :, :H].transpose(1, 2).reshape(B * KV, g * T, D)
            if self.sdpa:  # the model dtype, fused attention
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=self.scaling)
            else:  # float32 scores and weights (the CPU's)
                w = torch.baddbmm(bias, q.float(), keys.transpose(1, 2), alpha=self.scaling).softmax(-1)
                o = torch.bmm(w, values)
            o = o.view(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
            h = h + F.linear(o.to(self.dtype), *o_proj)
            gate, up = F.linear(self._rms(h, norm2), *gate_up).chunk(2, dim=-1)
            h = h + F.linear(act(gate) * up, *down)
        if col is None:
            self.length = end
        return self.head(self._rms(h[:, -1], self.norm))[:, :self.vocab_size]

    def _static_step(self, tok: torch.Tensor) -> torch.Tensor:
        """One static-mode step (all shapes fixed, no host value read): unmask and fill column
        ``col`` with ``tok`` (B,), then advance ``col`` and the positions."""
        self.key_bias.index_fill_(2, self.col, 0.0)
        out = self._run(tok[:, None], self.next_pos, self.key_bias, self.col).float()
        self.next_pos.add_(1)
        self.col.add_(1)
        return out

    def _capture(self) -> None:
        """Record ``_static_step`` once as a CUDA graph over static input/output buffers. The
        warm-up runs write and unmask the next column, which the first real step overwrites
        before anything reads it; the column and positions are restored after them."""
        self.tok_in = torch.zeros(self.next_pos.shape[0], dtype=torch.long, device=self.col.device)
        col0, pos0, bias0 = self.col.clone(), self.next_pos.clone(), self.key_bias.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._static_step(self.tok_in)
                self.col.copy_(col0)
                self.next_pos.copy_(pos0)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._static_step(self.tok_in)
        self.col.copy_(col0)  # capturing recorded the step without running it: restore anyway
        self.next_pos.copy_(pos0)
        self.key_bias.copy_(bias0)

    def feed(self, tok: torch.Tensor) -> None:  # tok (B,)
        if self.graph is not None:
            self.tok_in.copy_(tok)
            self.graph.replay()
            self.last = self.out
        elif self.static:
            self.last = self._static_step(tok)
        else:
            self.last = self._run(tok[:, None], self.next_pos, self.key_bias[:, :, :self.length + 1]).float()
            self.next_pos = self.next_pos + 1


def _stepper(model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, pad_id: int,
             vocab_size: int | None):
    """The static-cache decoder where it reproduces ``model`` (CUDA-graphed on a GPU), else the
    generic KV-cached one."""
    if _fast_decoding_supported(model):
        return _StaticStepper(model, prompts, max_new_tokens, pad_id, vocab_size)
    return _Stepper(model, prompts, pad_id, vocab_size)


@torch.no_grad()
def sample(student: torch.nn.Module | None, student_prompts: list[list[int]], max_new_tokens: int, *,
           lam: float = 1.0, teacher: torch.nn.Module | None = None, teacher_prompts: list[list[int]] | None = None,
           temperature: float = 1.0, greedy: bool = False, logratio_clip: float | None = None,
           plausibility_alpha: float | None = None, generator: torch.Generator | None = None,
           pad_id: int = PAD_ID, eos_id: int | Sequence[int] = EOS_ID, vocab_size: int | None = None,
           codec=None, stop_early: bool = True, teacher_temperature: float | None = None,
           keep_teacher_logits: bool = False) -> Rollout:
    """Sample one response per prompt under pi_lambda, on the models' device.

    ``student_prompts`` / ``teacher_prompts`` are token-id lists (with <s>); teacher prompts
    default to the student's. ``greedy`` takes the argmax of pi_lambda. ``temperature`` divides
    the student's logits and ``teacher_temperature`` the teacher's (default: ``temperature``)
    before they are mixed. ``pad_id`` fills prompt padding and the columns
    after a row's stop; ``eos_id`` is the stop id, or several; logits are cut to ``vocab_size``
    ids. ``codec`` (``kdlab.models.codec``) gives all three at once; the defaults are kdlab's char
    tokenizer's. ``generator``: on the models' device or on the CPU. ``stop_early``: stop once
    every row has stopped (off under FSDP, where every rank runs the same number of forwards).
    ``keep_teacher_logits``: also return the teacher's logits at every step (``Rollout.teacher_logits``,
    when the teacher takes part, lam != 1): the next-token distributions a distillation loss compares
    with, so a lambda-mixture step need not run the teacher again. The tokens, mask and entropy
    come back on the CPU.
    """
    if codec is not None:
        pad_id, eos_id, vocab_size = codec.pad_id, codec.stop_ids, codec.vocab_size
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 (or use greedy=True), got {temperature}")
    if not greedy and teacher_temperature is not None and teacher_temperature <= 0:
        raise ValueError(f"teacher_temperature must be > 0 (or use greedy=True), got {teacher_temperature}")
    need_s, need_t = lam != -1.0, lam != 1.0
    if need_s and student is None:
        raise ValueError("lam != -1 needs a student model")
    if need_t and teacher is None:
        raise ValueError(f"lam={lam} needs a teacher model")
    if teacher_prompts is None:
        teacher_prompts = student_prompts
    if len(teacher_prompts) != len(student_prompts):
        raise ValueError("teacher_prompts and student_prompts differ in length")
    steppers = {}
    device = next((student if need_s else teacher).parameters()).device
    stop_ids = [eos_id] if isinstance(eos_id, int) else list(eos_id)
    if not stop_ids:
        raise ValueError("eos_id must name at least one stop id, got an empty sequence")
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    guard_id = next((i for i in stop_ids if vocab_size is None or i < vocab_size), stop_ids[0])  # a diverged row's
    # Whether every row has stopped is a host read: each step on a CPU (free there), every
    # STOP_CHECK steps elsewhere (a GPU then queues steps without waiting); the columns decoded
    # after the last row stopped are cut off, so the rollout is the same either way.
    check_every = 1 if device.type == "cpu" else STOP_CHECK
    if need_s:
        steppers["s"] = _stepper(student, student_prompts, max_new_tokens, pad_id, vocab_size)
    if need_t:
        steppers["t"] = _stepper(teacher, teacher_prompts, max_new_tokens, pad_id, vocab_size)
    B = len(student_prompts)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    toks, ents, alive, t_logits = [], [], [], []
    keep = keep_teacher_logits and need_t
    temp = 1.0 if greedy else temperature
    t_temp = 1.0 if greedy else teacher_temperature
    for step in range(max_new_tokens):
        tok, ent = next_token(steppers["s"].last if need_s else None, steppers["t"].last if need_t else None, lam,
                              temp, greedy=greedy, logratio_clip=logratio_clip,
                              plausibility_alpha=plausibility_alpha, stop_id=guard_id, generator=generator,
                              teacher_temp=t_temp)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        alive.append(~done)
        toks.append(tok)
        if keep:  # a copy: a CUDA-graphed stepper overwrites its output buffer at the next step
            t_logits.append(steppers["t"].last.clone())
        ents.append(torch.where(done, torch.zeros_like(ent), ent))
        done = done | torch.isin(tok, stops)
        if step == max_new_tokens - 1 or (stop_early and (step + 1) % check_every == 0 and bool(done.all())):
            break
        for st in steppers.values():
            st.feed(tok)
    tokens = torch.stack(toks, 1).cpu()  # (B, R)
    mask = torch.stack(alive, 1).cpu()  # sampled tokens up to and including the first stop
    entropy = torch.stack(ents, 1).cpu()
    kept = torch.stack(t_logits, 1) if keep else None  # (B, R, V)
    if stop_early and check_every > 1:  # cut the columns decoded after every row had stopped
        width = int(mask.any(0).nonzero().max()) + 1 if bool(mask.any()) else 1
        tokens, mask, entropy = tokens[:, :width], mask[:, :width], entropy[:, :width]
        kept = kept[:, :width] if kept is not None else None
    return Rollout(tokens=tokens, mask=mask, entropy=entropy, teacher_logits=kept)
