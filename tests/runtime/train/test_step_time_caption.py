"""The step-time figure says which cost model its estimate is, read from the run's records."""

import json

import pytest

from datacentric.train.reporting import run_plots

pytest.importorskip("matplotlib")


def _run(folder, cost_model):
    folder.mkdir()
    records = [
        {"iteration": i, "iteration_time_s": 1.0, "est_makespan_s": 0.1, "loss": 2.0}
        for i in range(3)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if cost_model:
        (folder / "config.json").write_text(json.dumps({"cost": {"cost_model": cost_model}}))
    return folder


def _captions(folder, monkeypatch):
    """The figure-level texts of each figure ``plot_run`` saves, by file name."""
    from matplotlib.figure import Figure

    texts, save = {}, Figure.savefig

    def record(fig, path, *args, **kwargs):
        texts[path.name] = [" ".join(t.get_text().split()) for t in fig.texts]
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    run_plots.plot_run(folder)
    return texts


@pytest.mark.parametrize("cost_model", ["analytic", "profile", None])
def test_step_time_figure_captions_the_runs_cost_model(tmp_path, monkeypatch, cost_model):
    texts = _captions(_run(tmp_path / "run", cost_model), monkeypatch)
    assert texts["step_time.png"] == [run_plots.ESTIMATE_CAPTIONS[cost_model]]
    assert texts["loss.png"] == [] and texts["idle_share.png"] == []
    if cost_model == "analytic":
        assert "idle machine" in texts["step_time.png"][0]
    if cost_model == "profile":
        assert "profile" in texts["step_time.png"][0]


def test_a_run_without_idle_share_data_plots_without_a_warning(tmp_path):
    import warnings

    folder = _run(tmp_path / "run", "analytic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels" included
        saved = run_plots.plot_run(folder)
    assert {p.name for p in saved} >= {"loss.png", "step_time.png", "idle_share.png"}
