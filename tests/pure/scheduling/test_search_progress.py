"""``static`` tells how far its search and build are (``on_step.searched``, in the
micro-batches it prices), ``dcp-opt`` how far the step it builds is (``step_begun``,
``laid_out``), which a command's progress line turns into a time left while no step is
out yet; the schedule is the same with or without a listener."""

from __future__ import annotations

from toy_cost_model import ToyCostModel, mixed_text, toy_pipeline

from datacentric.scheduling.resume import schedule_fingerprint
from datacentric.settings import SchedulingConfig

MODEL = ToyCostModel(capacity_bytes=16 * 2**20)


class Listener:
    """An ``on_step`` with a ``searched``: what each was told."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []
        self.search: list[tuple[float, float]] = []
        self.layouts: list[list[float]] = []
        """Per step told begun: the work it said, then each count laid out."""
        self.aside: list[tuple[int, float]] = []
        """Work made once for the epoch: (steps told before it, its seconds)."""

    def __call__(self, done: int, total: int) -> None:
        self.steps.append((done, total))

    def searched(self, done: float, total: float) -> None:
        self.search.append((done, total))

    def step_begun(self, work: float) -> None:
        assert len(self.layouts) == len(self.steps) - 1  # after the steps before it
        self.layouts.append([work])

    def laid_out(self, count: float) -> None:
        self.layouts[-1].append(count)

    def set_aside(self, seconds: float) -> None:
        self.aside.append((len(self.steps), seconds))


def heard_building(policy: str) -> tuple[Listener, int]:
    """What a listener heard while ``policy`` scheduled a mixed set, and its steps; the
    schedule is checked to be the one built with no listener."""
    shapes = mixed_text(300, seed=4)
    plain = toy_pipeline(shapes, MODEL, world_size=8).schedule(policy=policy)
    heard = Listener()
    told = toy_pipeline(shapes, MODEL, world_size=8).schedule(policy=policy, on_step=heard)
    assert schedule_fingerprint(told) == schedule_fingerprint(plain)
    return heard, len(plain.iterations)


def test_static_tells_its_search_in_micro_batches_priced_and_builds_the_same_schedule():
    heard, _ = heard_building("static")
    done = [d for d, _ in heard.search]
    assert len(done) > 20 and done == sorted(done)  # many reports, never backwards
    assert heard.search[-1][0] == heard.search[-1][1] > 0  # it ends at its total
    assert all(d <= t * (1 + 1e-9) for d, t in heard.search)
    # the total said before the first step is priced is within half of the work done
    assert 0.5 <= heard.search[0][1] / heard.search[-1][1] <= 1.5, heard.search[0]


def test_static_tells_each_candidate_as_its_sampled_steps_are_priced(monkeypatch):
    """A candidate priced on several sampled steps is told after each but the last
    (its micro-batches by the steps' samples): the search has a pace within its first
    candidate, which pays the pricing tables' start (2.8 s of CPU on sft-longtail at
    64 GPUs, the search's only count till then before)."""
    from datacentric.scheduling import static

    heard, inside, real = Listener(), [], static.price

    def price(inp, table, sp, budget, chunks, priced=None):
        before = len(heard.search)
        try:
            return real(inp, table, sp, budget, chunks, priced)
        finally:
            inside.append((len(chunks), [d for d, _ in heard.search[before:]]))

    monkeypatch.setattr(static, "price", price)
    options = SchedulingConfig(global_batch_samples=60)  # 5 steps, 4 of them sampled
    toy_pipeline(mixed_text(300, seed=4), MODEL, world_size=8, options=options).schedule(
        policy="static", on_step=heard
    )
    assert len(inside) > 5 and all(chunks > 1 for chunks, _ in inside)
    for chunks, told in inside:
        assert len(told) == chunks - 1 and told == sorted(set(told)), (chunks, told)
    starts = [d for d, _ in heard.search]
    assert inside[0][1][0] > starts[0] == 0  # the first candidate's first step, told


def test_a_plain_step_callback_hears_only_steps():
    seen: list[tuple[int, int]] = []
    shapes = mixed_text(120, seed=1)
    toy_pipeline(shapes, MODEL, world_size=8).schedule(
        policy="static", on_step=lambda d, t: seen.append((d, t))
    )
    assert seen and seen[-1][0] == seen[-1][1]


def test_dcp_opt_tells_its_steps_first_then_each_steps_layouts_and_builds_the_same_schedule():
    heard, steps = heard_building("dcp-opt")
    assert heard.steps[0] == (0, steps)  # the epoch's steps, before the first is out
    assert len(heard.layouts) == steps and not heard.search
    for work, *laid in heard.layouts:  # each step said its work, then laid it out
        assert work > 0 and laid and 0.25 * work <= sum(laid) <= 2 * work, (work, laid)
    # made once, in the first step: its token-packed step makers and its portfolio's
    # peer searches (static, dcp-pac), each set aside, not paced
    assert [steps for steps, _ in heard.aside] == [1, 1, 1], heard.aside
    assert all(seconds > 0 for _, seconds in heard.aside)
