"""A position read back from its JSON holds lists of its own: the run advancing it never
changes the state it was loaded from (``DataCentric.load_state_dict(state)``), which a
caller may load again."""

from __future__ import annotations

import copy

from datacentric.scheduling.resume import Position


def test_advancing_a_position_read_back_leaves_the_saved_state_as_it_was():
    saved = Position(
        epoch=0, segment_world=2, segment_excluded=[3], segment_iteration=1, consumed=[3, 5]
    ).to_json()
    kept = copy.deepcopy(saved)
    position = Position.from_json(saved)
    position.advance([7, 8], segment_length=4)
    assert position.consumed == [3, 5, 7, 8]
    assert saved == kept
    again = Position.from_json(saved)  # loaded again: where it was saved
    assert again.consumed == [3, 5] and again.segment_iteration == 1
