"""What a pipeline will cost before it runs and whether this machine can hold it (``mclpipe plan``, and the check
``mclpipe run`` makes before its first step).

- :mod:`planning.model`: the cost model (the data's size, calibrated rates, one estimator per kind of step, the
  run's own costs) and the slopes ``make bench-scale`` measured (``bench_scale_slopes.json``);
- :mod:`planning.calibrate`: a few batches of each kind of step measured on the user's data and device;
- :mod:`planning.probes`: cheap probes of the machine and the process (free disk, available memory, peak RSS);
- :mod:`planning.feasibility`: what this machine cannot hold, one line naming the fix;
- :mod:`planning.report`: the plan as rows and lines for people.

Layers: this package sits above the library (``contrastive``) and the typed config (``pipeline_config``) and below
``tasks`` and ``flows``; it imports neither of those, and ``pipeline_config`` imports nothing from it
(``tests/unit/test_layers.py``). The steps it plans come from the flows' stage graph (``flows.plan_steps``).
"""
