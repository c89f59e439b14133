"""datacentric.parallel: the data-centric runtime on real ranks (see docs/runtime.md).

- ``groups``: :class:`ProcessGroups`, every aligned SP group, created once;
- ``launch``: ``spawn`` N local ranks, ``init_from_env`` under torchrun;
- ``ulysses``: all-to-all sequence-parallel attention, switched per micro-batch;
- ``sequence_shards``: a packed micro-batch's contiguous shard for one rank of its group;
- ``loss``: the one loss-normalisation helper (per token, per sample);
- ``grad_sync``: the once-per-iteration gradient SUM (plain, DDP, FSDP2);
- ``recompute``: per-block activation checkpointing switched per micro-batch;
- ``runtime``: :class:`DataCentricRuntime`, one iteration of a schedule on this rank;
- ``step``: :class:`Step`, the one driver of an iteration's micro-steps.
"""
