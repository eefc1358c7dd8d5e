"""The bottom layer: pure tensor and data functions and shared names, importing nothing from kdlab
outside ``core``: ``kl`` (the losses), ``mixture`` (pi_lambda), ``metrics`` (pass@k, update
sparsity), ``schema`` (names the profile and the code share), ``dtypes`` (parameter dtypes by
name), ``atomic`` (the one atomic writer) and ``faults`` (kdlab's exceptions)."""
