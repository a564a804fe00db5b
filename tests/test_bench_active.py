"""benchmarks/bench_active.py: the verdict's interpolation, the plot, the schedule, and a tiny run."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from benchmarks.bench_active import crossing, draw_plot, main, round_config
from siamese.suggest import KINDS
from siamese.train import LabeledPair, TrainConfig


def test_crossing_interpolates_between_schedule_points():
    curve = [(50, 0.6), (100, 0.8), (200, 0.9), (300, 0.95)]
    at, how = crossing(curve, 0.85)
    assert at == pytest.approx(150.0)
    assert "between 100 and 200" in how


def test_crossing_at_a_point_the_first_one_and_never():
    curve = [(50, 0.6), (100, 0.8), (200, 0.9)]
    assert crossing(curve, 0.8)[0] == 100.0
    assert crossing(curve, 0.5) == (50.0, "at the schedule point 50")
    assert crossing(curve, 0.95) == (None, "never")


def test_crossing_needs_the_first_reaching_point_not_a_later_dip():
    at, _ = crossing([(50, 0.9), (100, 0.7), (200, 0.95)], 0.85)
    assert at == 50.0


def test_round_config_gives_small_rounds_enough_steps():
    pairs = [LabeledPair(str(i), f"a{i}", f"b{i}", i % 2 == 0) for i in range(64)]  # no implied pairs
    config = TrainConfig(epochs=20, implied_ratio=1.0)
    assert round_config(pairs, config, min_steps=200).epochs == 200  # one step per epoch
    assert round_config(pairs, config, min_steps=10).epochs == 20  # never fewer than the configured epochs


def test_draw_plot_writes_an_image(tmp_path):
    curves = {
        "suggested": [(50, 0.7, 0.65, 0.75), (100, 0.85, 0.8, 0.9)],
        "random": [(50, 0.6, 0.55, 0.62), (100, 0.8, 0.78, 0.83)],
    }
    path = tmp_path / "sub" / "active.png"
    draw_plot(curves, 0.8, path, "title")
    with Image.open(path) as image:
        assert image.size == (760, 460)
        assert image.mode == "RGB"


@pytest.mark.slow
def test_a_tiny_run_prints_the_table_and_the_verdict(tmp_path, capsys):
    out = tmp_path / "active.png"
    args = ["--quick", "--schedule", "40,80", "--pool", "200", "--test-pairs", "60", "--steps", "2", "--epochs", "1"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| labeled pairs | suggested | random |" in printed
    assert any(line.startswith(("suggestions reach", "goal missed")) for line in printed.splitlines())
    assert out.exists()
    saved = json.loads(out.with_suffix(".json").read_text())
    suggested = saved["seeds"][0]["suggested"]
    assert len(suggested["pairs"]) == 80
    assert {row[3] for row in suggested["pairs"]} <= set(KINDS)
    assert all(-1.0 <= row[4] <= 1.0 for row in suggested["pairs"])  # the similarity when it was suggested
    # another seed, run apart, reports together with the first
    other = tmp_path / "other.png"
    assert main([*args, "--seeds", "1", "--out", str(other)]) == 0
    capsys.readouterr()
    both = tmp_path / "both.json"
    assert (
        main(
            [
                "--from-json",
                str(out.with_suffix(".json")),
                str(other.with_suffix(".json")),
                "--json",
                str(both),
                "--out",
                str(tmp_path / "both.png"),
            ]
        )
        == 0
    )
    assert "over 2 seed(s)" in capsys.readouterr().out
    merged = json.loads(both.read_text())["seeds"]
    assert merged[0]["suggested"]["pairs"] == suggested["pairs"]
    assert len(merged) == 2
    # one arm run alone is the same arm (arms share nothing but the setup), and reports beside the other
    alone = tmp_path / "random1.json"
    assert (
        main([*args, "--seeds", "1", "--arms", "random", "--out", str(tmp_path / "r1.png"), "--json", str(alone)]) == 0
    )
    assert json.loads(alone.read_text())["seeds"][0]["random"]["pairs"] == merged[1]["random"]["pairs"]
    with pytest.raises(SystemExit):
        main(["--from-json", str(out.with_suffix(".json")), str(alone), "--out", str(tmp_path / "x.png")])
    assert "no rounds saved for seed 1: suggested" in capsys.readouterr().err
    joined = tmp_path / "joined.json"
    files = [str(out.with_suffix(".json")), str(other.with_suffix(".json")), str(alone)]
    assert main(["--from-json", *files, "--json", str(joined), "--out", str(tmp_path / "j.png")]) == 0
    seed1 = json.loads(joined.read_text())["seeds"][1]
    assert seed1["random"]["rounds"] == json.loads(alone.read_text())["seeds"][0]["random"]["rounds"]  # the last file's
    assert seed1["suggested"]["pairs"] == merged[1]["suggested"]["pairs"]
