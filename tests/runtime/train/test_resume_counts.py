"""What a resumed run reports covers the whole run: ``loss_tokens`` as ``samples_seen``."""

from __future__ import annotations

from run_config import small_config

from datacentric.parallel.launch import spawn
from datacentric.train.trainer import train_rank


def test_loss_tokens_after_resume_cover_the_whole_run(tmp_path) -> None:
    straight = small_config(tmp_path / "straight", iterations=4, checkpoint_every=2)
    (whole,) = spawn(train_rank, 1, straight, timeout_s=300)
    first = small_config(tmp_path / "resumed", iterations=2, checkpoint_every=2)
    (part,) = spawn(train_rank, 1, first, timeout_s=300)
    again = small_config(tmp_path / "resumed", iterations=4, checkpoint_every=2, resume=True)
    (rest,) = spawn(train_rank, 1, again, timeout_s=300)
    assert 0 < part.loss_tokens < whole.loss_tokens
    assert rest.samples_seen == whole.samples_seen
    assert rest.loss_tokens == whole.loss_tokens
