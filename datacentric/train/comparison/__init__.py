"""A measured comparison of policies (``bench``, ``demo``): the same samples trained
under each policy, repeated, beside the simulator's prediction for the very same
schedules, and what may skew or cut short the measurement.

- :mod:`.measured_comparison`: the runs, one per policy and repeat, and what each
  measured against what the simulator predicts (``compare_policies``, ``Comparison``);
- :mod:`.machine_load`: how busy the machine was while they were timed
  (``LoadReading``, ``CpuClock``);
- :mod:`.comparison_stop`: a comparison stopped by a signal says what it finished
  (``ComparisonStopped``).

Nothing is imported here: each module is loaded where it is used (``demo`` prints its
first line before torch loads).
"""
