"""Drop-in trainers: keep a TRL or transformers training script, change one import.

- :class:`datacentric.integrations.trl.SFTTrainer` for TRL's ``SFTTrainer``;
- :class:`datacentric.integrations.transformers.Trainer` for transformers' ``Trainer``.

Both translate their arguments to the settings of a ``datacentric train`` run and run
its trainer (no training loop of their own); docs/integrations.md maps every field.
TRL, transformers and peft are imported only when a drop-in trainer is used (the
``trl`` extra). This package is the top layer: nothing of ours imports it.
"""
