"""Names that the parameter schema (``kdlab.study.config``) and the code it names share, declared once.

A leaf module: it imports nothing, so ``config`` can validate against these names without
importing models or tasks, and models, tasks and the loops read the same lists.
"""
from __future__ import annotations

# Target tasks built into kdlab (a real profile names its own, from data files).
TARGET_TASKS = ("countdown-3", "countdown-4", "countdown-4e", "kb-mc", "rules-mc")
# Countdown variants the ``dfs`` trace is defined for (longer dfs traces outgrow the models' positions).
DFS_VARIANTS = ("countdown-3",)
# KL directions and losses (``kdlab.core.kl``): full-vocabulary directions, the sampled estimators
# and the paper's sampled KL ``sf`` (one extra token per position, score-function surrogate).
DIRECTIONS = ("forward", "reverse")
ESTIMATORS = ("k1", "k2", "k3")
SCORE_FUNCTION = "sf"
SAMPLED_KINDS = ESTIMATORS + (SCORE_FUNCTION,)  # the kinds that use ``sample_direction``
LOSS_KINDS = ("forward", "reverse", "jsd", "k1", "k2", "k3", SCORE_FUNCTION)
# Parameter dtypes: bf16 keeps no fp32 master copy (as in the paper); fp32 for comparison.
DTYPES = ("bf16", "fp32")
# a toy model's pretraining arithmetic: bf16 autocast over fp32 weights (the first, the default), or fp32
PRETRAIN_ARITHMETIC = ("bf16", "fp32")
PIPELINES = ("rlvr-only", "distill-rlvr", "joint")  # how distillation and RLVR combine (kdlab.study.followups)
# Real models kdlab imports from a package of the registry (kdlab.study.recipes), by name.
IMPORTABLE = ("smollm2",)
# A task teacher kdlab builds by supervised fine-tuning of the student's base (kdlab.study.recipes).
SFT_TEACHER = "sft"
# Model families and size presets of kdlab's toy models: (hidden, layers, heads, kv_heads, mlp).
FAMILIES = ("llama", "qwen2")
PRESETS: dict[str, dict[str, int]] = {
    "nano": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, intermediate_size=192),
    "student-xs": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=288),
    "student-s": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=384),
    "student-m": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=576),
    "teacher-xs": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=576),
    "teacher-s": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=768),
    "teacher-m": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4, intermediate_size=768),
}
