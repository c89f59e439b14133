"""The SP sizes a model may plan with on a world (``planning.heads.ulysses_sp_sizes``):
the step's sizes (powers of two dividing the world, and the whole world) its heads
allow, none above its ``max_sp_size``; read off any object with the model contract's
head counts, with no torch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from moved_names import assert_given_as_defined

from datacentric.planning.heads import ulysses_sp_sizes


def test_the_sizes_are_the_steps_sizes_the_heads_allow_under_the_models_cap() -> None:
    six = SimpleNamespace(num_heads=6)
    assert ulysses_sp_sizes(six, 3) == [1, 3]
    assert ulysses_sp_sizes(six, 6) == [1, 2, 6]
    assert ulysses_sp_sizes(six, 12) == [1, 2]  # 4 and 12 do not divide 6 heads
    grouped = SimpleNamespace(num_heads=8, num_kv_heads=2)  # key/value heads repeated
    assert ulysses_sp_sizes(grouped, 8) == [1, 2, 4, 8]
    capped = SimpleNamespace(num_heads=8, max_sp_size=2)
    assert ulysses_sp_sizes(capped, 8) == [1, 2]
    assert ulysses_sp_sizes(SimpleNamespace(), 6) == [1, 2, 6]  # no heads: the step's own
    with pytest.raises(ValueError, match="not a multiple"):
        ulysses_sp_sizes(SimpleNamespace(num_heads=6, num_kv_heads=4), 2)


def test_the_step_rule_lives_beside_the_head_rule_and_keeps_its_old_import() -> None:
    """A step's SP sizes (powers of two dividing the world, and the whole world) are
    decided in ``planning.heads`` beside the heads' rule; ``planning.bucket_options``,
    their old home, still gives the same functions."""
    from datacentric.planning import heads

    assert heads.mixable_sp_sizes(12) == [1, 2, 4, 12]
    assert heads.nesting_sp_sizes(16, 8, None) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="SP sizes \\[3\\] cannot run at world size 6"):
        heads.check_step_sp_sizes(6, [1, 3])
    for name in ("mixable_sp_sizes", "nesting_sp_sizes", "check_step_sp_sizes"):
        assert_given_as_defined(
            "datacentric.planning.bucket_options", "datacentric.planning.heads", name
        )


def test_a_schedule_above_the_models_declared_caps_is_refused_naming_why() -> None:
    """The caps a model declares (``max_sp_size``, ``max_ring_size`` and their reasons)
    are checked beside the heads' rule, with no torch: the smallest size above the cap
    is named, with the model's reason; a model declaring none takes any size."""
    from datacentric.planning.heads import check_max_ring_size, check_max_sp_size

    class Whole:
        max_sp_size, max_sp_size_reason = 2, "its loss needs whole samples"
        max_ring_size = 1

    check_max_sp_size(Whole(), [1, 2])
    check_max_ring_size(Whole(), [1])
    check_max_sp_size(SimpleNamespace(), [64])
    with pytest.raises(ValueError, match="^Whole runs exactly only up to SP size 2, not 4: its"):
        check_max_sp_size(Whole(), [8, 4, 1])
    with pytest.raises(ValueError, match="rings of at most 1 position, not 2 .* declares it$"):
        check_max_ring_size(Whole(), [2, 1])
