"""Validation during training, beside the run loop: the held-out samples and their
loss, the prompts a text model continues, the renders of a diffusers pipeline, and when
each runs.

- :mod:`.held_out`: the held-out set (opened with the training set without it by
  ``data/sources.build_run_data``), scheduled once forward only (``HeldOut``), and its
  loss (``validation_loss``);
- :mod:`.prompts`: a text model's completions of the ``prompts`` file
  (``PromptSamples``), written to ``validation/step-N.jsonl``;
- :mod:`.renders`: a diffusers model's renders of the prompts through its pipeline
  (``PipelineSamples``), written to ``validation/step-N/`` with a contact sheet;
- :mod:`.driver`: when validation is due and the best step so far
  (``ValidationRecord``), and what runs after a due step (``RunValidation``).

Nothing is imported here: each module is loaded where it is used (the check before the
ranks start reads the held-out set without the trainer).
"""
