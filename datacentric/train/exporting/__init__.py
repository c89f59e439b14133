"""A trained run's model written out in the format it came in (``datacentric export``).

- :mod:`.export`: the run folder's checkpoint read in one process, gathered into full
  tensors and written as a Hugging Face model, a diffusers transformer or a
  ``state_dict``, with the record of what was exported (``export_run``);
- :mod:`.export_folders`: the run folder, the checkpoint of it to export and the output
  folder, checked before torch loads (``check_export``), and the record of an export;
- :mod:`.lora_export`: a ``[lora]`` run's adapters in the formats their libraries load
  (a PEFT adapter folder, diffusers' LoRA weights), or merged into the base weights.

(The folder is ``exporting`` because ``export`` is the module that does it.) Nothing is
imported here: each module is loaded where it is used.
"""
