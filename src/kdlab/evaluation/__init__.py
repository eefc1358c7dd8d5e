"""Evaluation of a model: ``evaluate`` (greedy pass@1, pass@k, countdown error modes) and
``style`` (the style experiment's tasks and metrics). Imports the engine's sampler and below."""
