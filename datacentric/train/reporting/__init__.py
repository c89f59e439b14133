"""What a training run reports: its per-step records and where they go, its figures,
its profiler traces, and the heartbeat that says which rank stopped.

- :mod:`.metrics`: what a step record holds (``step_record``; beyond loss and speed,
  ``StepMetrics``), and the readers of ``metrics.jsonl`` (``read_metrics``);
- :mod:`.metric_sinks`: where the records go (``metrics.jsonl``, the log line,
  TensorBoard, W&B: ``MetricsLogger``) and the ``datacentric`` logger's set-up;
- :mod:`.run_plots`: a run's figures drawn from its ``metrics.jsonl`` (``plot_run``);
- :mod:`.timeline`: every rank's spans of a step, gathered into its record and read
  back by the comparisons (``timeline = true``);
- :mod:`.step_trace`: ``torch.profiler`` traces and memory snapshots of chosen steps
  (``StepTracer``);
- :mod:`.heartbeat`: every rank's beat and phase through the job's store, read after a
  collective times out (``Heartbeat``).

Nothing is imported here: each module is loaded where it is used (``plot`` and
``demo`` read ``metrics.jsonl`` without the trainer).
"""
