"""The engine: everything that runs models. ``batching`` and ``rollout`` (the sampler), ``data``
(problem pools), the distillation run (``run_config``, ``optim``, ``precision``, ``ranks``,
``offpd``: the OffPD pool and teacher-logit cache, ``distill``: the loop), ``sft`` (supervised
fine-tuning), ``rlvr`` (GRPO) and ``gradients`` (the gradient experiment's sampling and gradients).
Imports ``core``, ``tasks`` and ``models``."""
