"""A run's checkpoints and its resume: writing, verifying and reading them, and when.

- :mod:`.checkpoint`: atomic, checksummed checkpoints on ``torch.distributed.checkpoint``
  (the run folder's ``checkpoints/`` layout; every name of the parts below);
  :mod:`.checkpoint_folders`: the folder's names, which checkpoints a run holds;
  :mod:`.checkpoint_save`: writing one (in the background or not), a full disk named;
  :mod:`.checkpoint_verify`: every file against the manifest, the pin, which checkpoint a
  run trusts; :mod:`.checkpoint_load`: reading one into a run, or its model's tensors
  alone, and the weights' SHA-256;
- :mod:`.run_checkpoints`: the ``[checkpoint]`` section at work (which checkpoint a start
  resumes from, which steps are saved, ``keep_last``, ``async_save``: ``RunCheckpoints``);
- :mod:`.run_saves`: the running trainer's saves, one at a time (in the background or
  not), each phase named by the heartbeat, and what a stop without a save keeps
  (``RunSaves``);
- :mod:`.resume`: what a resume refuses to change (``RESUME_FIXED``), the state a
  checkpoint records of the run (``trainer.json``) and the step records a resume cuts;
- :mod:`.run_paths`: where the paths a run recorded as typed point (relative to the
  directory it was started in), for an export or a resume run elsewhere;
- :mod:`.safe_load`: reading a checkpoint without running code from it (allow-listed
  unpickling of every pickle it holds);
- :mod:`.state_names`: the aliases of a model's state (one tensor under two names),
  stored once and put back on load;
- :mod:`.preemption`: SIGTERM/SIGINT recorded, agreed on by every rank at a step
  boundary, then an ordinary save and exit (``[checkpoint] save_on_signal``).

Nothing is imported here: each module is loaded where it is used (``inspect`` reads a
checkpoint without the trainer).
"""
