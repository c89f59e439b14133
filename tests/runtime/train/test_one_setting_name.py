"""``DataCentric``: each scheduling setting is given once. ``options`` alone is used as
given (its policy too), ``policy=``/``tokens_per_iteration=`` alone are used as given,
neither gives ``dcp-opt``; one given beside an ``options`` that says otherwise is one
line naming both."""

from __future__ import annotations

import pytest
import torch

from datacentric.data.stdlib import StdlibCorpus
from datacentric.models.presets import build_model
from datacentric.parallel.groups import ProcessGroups
from datacentric.settings import SchedulingConfig
from datacentric.train.data_centric import DataCentric, scheduling_options

pytestmark = pytest.mark.usefixtures("one_thread")


def data_centric(**kwargs) -> DataCentric:  # noqa: ANN003
    torch.manual_seed(0)
    dataset = StdlibCorpus(max_tokens=256, limit=1)
    return DataCentric(
        build_model("llama"),
        dataset,
        preset="llama",
        groups=ProcessGroups.local(),
        check_model=False,
        prefetch=0,
        **kwargs,
    )


def test_options_alone_schedule_with_their_policy() -> None:
    dc = data_centric(options=SchedulingConfig(policy="static", tokens_per_iteration=1024))
    assert dc.pipeline.policy == "static"
    assert dc.pipeline.options.tokens_per_iteration == 1024
    assert dc.schedule().policy == "static"


@pytest.mark.parametrize(
    ("kwargs", "policy", "tokens"),
    [
        ({}, "dcp-opt", None),
        ({"policy": "static"}, "static", None),
        ({"tokens_per_iteration": 1024}, "dcp-opt", 1024),
        ({"policy": "static", "options": SchedulingConfig(policy="static")}, "static", None),
        (
            {"tokens_per_iteration": 512, "options": SchedulingConfig(tokens_per_iteration=512)},
            "dcp-opt",
            512,
        ),
    ],
)
def test_each_setting_alone_or_agreeing_is_used(kwargs: dict, policy: str, tokens) -> None:  # noqa: ANN001
    options = scheduling_options(
        kwargs.get("options"), kwargs.get("policy"), kwargs.get("tokens_per_iteration")
    )
    assert (options.policy, options.tokens_per_iteration) == (policy, tokens)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"policy": "static", "options": SchedulingConfig(policy="dcp-opt")},
            "DataCentric: policy='static' and options.policy='dcp-opt' differ",
        ),
        (
            {"tokens_per_iteration": 2048, "options": SchedulingConfig()},
            "DataCentric: tokens_per_iteration=2048 and options.tokens_per_iteration=None differ",
        ),
    ],
)
def test_a_setting_given_twice_differently_is_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        data_centric(**kwargs)
    assert "\n" not in str(error.value)


def test_a_setting_given_twice_is_refused_before_the_model_is_checked(monkeypatch) -> None:
    """The scheduling settings are resolved first: the contradiction is named before the
    model contract's forward passes, compilation or wrapping."""
    import datacentric.train.data_centric as data_centric_module

    checked = []
    monkeypatch.setattr(
        data_centric_module, "check_model_contract", lambda *args: checked.append(args)
    )
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="policy='static' and options.policy='dcp-opt'"):
        DataCentric(
            build_model("llama"),
            StdlibCorpus(max_tokens=256, limit=1),
            preset="llama",
            groups=ProcessGroups.local(),
            policy="static",
            options=SchedulingConfig(policy="dcp-opt"),
            prefetch=0,
        )
    assert checked == []
