"""Training: the run loop at this level, each of its components in a folder beside it.

The loop, read in the order a run uses it:

- ``assemble.py`` and ``build.py``: the one assembly of a run, in order (data, model
  and its description, cost model, global batch, ``DataCentric``, optimizer);
- ``data_centric.py``: ``DataCentric``, the loop a user writes (its steps, the same the
  trainer runs), with ``schedule_ahead.py`` (each epoch's schedule built beside the
  steps) and ``sampler.py`` (a rank's batches for a ``DataLoader``);
- ``trainer.py``: one rank's run (``train_rank``): resume, the steps, the saves,
  validation when due, the result; ``trainer_step.py`` (one step of it),
  ``trainer_saves.py`` (its resume, saves and stop notes), ``lr_schedule.py`` (its
  learning-rate schedule), ``hooks.py`` (what a caller runs at its events),
  ``fault_injection.py`` (the faults the reliability tests plant in it),
  ``run_folder.py`` (whose run a folder holds, its lock, the schedules it ran),
  ``rank_agreement.py`` (the ranks' checks at the start that they were given the same
  settings, run folder and made the same plan);
  ``config.py`` is the settings' deprecated location.

Beside it, one concern per folder: ``checkpoints/`` (save, verify, load, resume),
``validation/`` (validation's driver: held-out loss, prompts, renders), ``reporting/``
(what the run reports: step records and their sinks, figures, traces, timeline,
heartbeat), ``exporting/`` (a trained run's model written out) and ``comparison/`` (the
measured comparison of policies: ``bench``, ``demo``, the machine's load).
"""
