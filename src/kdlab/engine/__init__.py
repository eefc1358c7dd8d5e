"""The engine: everything that runs models. ``batching`` and ``rollout`` (the sampler), ``data``
(problem pools), ``trainer`` (the one trainer skeleton: AdamW, schedule, precision, gradient
accumulation, clipping, non-finite checks), the three loops, each a loss and a batch source on it:
``distill`` (with ``run_config``, ``offpd``: the OffPD pool and teacher-logit cache, ``ranks``,
``cpu``: allocator and attention settings), ``sft`` (supervised fine-tuning) and ``rlvr`` (GRPO),
and ``gradients`` (the gradient experiment's sampling and gradients).
Imports ``core``, ``tasks`` and ``models``."""
