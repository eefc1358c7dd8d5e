"""The study: profiles and their validation (``config``, ``preflight``), what a run is made of
(``materials``), building the models (``teachers``, ``recipes``, ``style_teacher``, ``building``),
one run end to end (``contract``: the run contract, built once; ``runs``; ``fsdp_run``, the launcher
that shards a run; ``followups``), its records (``records``,
``results``, ``atomic`` writes in ``kdlab.core``), the report (``report_page``,
``report_tables``) and the runner of ``kdlab study``: ``plan`` (grid, jobs, completeness),
``kernels`` (warm kernels, papermill, workers, Ray via ``distributed``) and ``runner``
(``run_study`` as named phases). Notebooks call the modules below the runner, never the runner.
"""
