"""The entropy-collapse benchmark's pure figures: window means, the reward-gain interval over steps, the
collapse / floor / rise verdicts of one run and the means over worlds (golden values)."""

from __future__ import annotations

import math

import pytest

from tests.helpers.bench import load_benchmark


@pytest.fixture(scope="module")
def ec():
    return load_benchmark("entropy_collapse")


def test_window_means_golden(ec):
    assert ec.window_means([1.0, 2.0, 3.0, 4.0, 5.0], 2) == (1.5, 4.5)
    with pytest.raises(ValueError, match="window=3"):
        ec.window_means([1.0, 2.0], 3)


def test_rolling_min_golden(ec):
    assert ec.rolling_min([3.0, 1.0, 2.0, 0.0, 4.0], 2) == pytest.approx(1.0)  # means 2, 1.5, 1, 2
    assert ec.rolling_min([3.0, 1.0], 1) == 1.0
    with pytest.raises(ValueError, match="window=3"):
        ec.rolling_min([1.0], 3)


def test_gain_interval_golden(ec):
    # first [0, 2] (mean 1, var 2), last [4, 6] (mean 5, var 2): gain 4, pooled var 2,
    # se sqrt(2 * 2 / 2) = sqrt(2), t(2 df) = 4.303
    lo, hi = ec.gain_interval([0.0, 2.0, 4.0, 6.0], 2)
    half = 4.303 * math.sqrt(2.0)
    assert lo == pytest.approx(4 - half) and hi == pytest.approx(4 + half)
    with pytest.raises(ValueError, match="window >= 2"):
        ec.gain_interval([1.0, 2.0], 1)


def test_run_report_collapse_and_rise(ec):
    entropy = [1.0, 1.0, 0.8, 0.6, 0.3, 0.3]  # first-2 mean 1.0, last-2 mean 0.3
    reward = [0.0, 0.1, 0.5, 0.6, 1.0, 1.1]
    r = ec.run_report(entropy, reward, window=2, floor=0.5)
    assert r["entropy_first"] == pytest.approx(1.0) and r["entropy_last"] == pytest.approx(0.3)
    assert r["entropy_ratio"] == pytest.approx(0.3) and r["entropy_min"] == pytest.approx(0.3)
    assert r["entropy_floor"] == pytest.approx(0.5)
    assert r["collapsed"] and not r["above_floor"]
    assert r["reward_gain"] == pytest.approx(1.0)
    lo, hi = r["reward_gain_interval"]  # both windows have variance 0.005: half = 4.303 * sqrt(0.005)
    assert lo == pytest.approx(1.0 - 4.303 * math.sqrt(0.005)) and lo > 0 and r["reward_rises"]


def test_run_report_floor_held_flat_reward(ec):
    r = ec.run_report([1.0, 0.9, 0.7, 0.6, 0.8, 0.9], [0.0, 1.0, 0.5, 0.5, 1.0, 0.0], window=2, floor=0.5)
    # 2-step rolling means 0.95, 0.8, 0.65, 0.7, 0.85: the least 0.65 >= 0.5 * 0.95
    assert not r["collapsed"] and r["above_floor"] and r["entropy_min"] == pytest.approx(0.65)
    assert r["reward_gain"] == pytest.approx(0.0) and not r["reward_rises"]


@pytest.mark.parametrize(
    ("entropy", "reward", "kw", "match"),
    [
        ([1.0] * 4, [0.0] * 3, {"window": 2, "floor": 0.5}, "one value per step"),
        ([1.0] * 4, [0.0] * 4, {"window": 2, "floor": 1.5}, "in \\(0, 1\\)"),
        ([1.0] * 3, [0.0] * 3, {"window": 2, "floor": 0.5}, "2 \\* window = 4"),
    ],
)
def test_run_report_bad_inputs(ec, entropy, reward, kw, match):
    with pytest.raises(ValueError, match=match):
        ec.run_report(entropy, reward, **kw)


def test_summarize_means_over_worlds(ec):
    def run(ratio, gain, chair, collapsed):
        return {"entropy_first": 1.0, "entropy_last": ratio, "entropy_ratio": ratio, "entropy_min": ratio,
                "reward_first": 0.0, "reward_last": gain, "reward_gain": gain, "collapsed": collapsed,
                "above_floor": not collapsed, "reward_rises": True, "zero_std_first": 0.0,
                "zero_std_last": 0.5, "eval": {"chair_i": chair, "recall": 0.8}}  # fmt: skip

    rows = [{"plain": run(0.2, 1.0, 0.10, True), "remedy": run(0.8, 0.5, 0.12, False)},
            {"plain": run(0.4, 2.0, 0.20, True), "remedy": run(0.9, 0.7, 0.14, False)}]  # fmt: skip
    s = ec.summarize(rows)
    assert s["plain"]["entropy_ratio"]["mean"] == pytest.approx(0.3)
    lo, hi = s["plain"]["entropy_ratio"]["interval"]  # sd 0.1414, t(1) 12.706: half 12.706 * 0.1
    assert lo == pytest.approx(0.3 - 1.2706) and hi == pytest.approx(0.3 + 1.2706)
    assert s["plain"]["collapsed"] == 2 and s["remedy"]["above_floor"] == 2 and s["remedy"]["pairs"] == 2
    assert s["remedy"]["chair_i"]["values"] == [0.12, 0.14]
    one = ec.summarize(rows[:1])
    assert one["plain"]["reward_gain"]["interval"] is None


def test_table_lists_every_run(ec):
    rep = ec.run_report([1.0, 1.0, 0.3, 0.3], [0.0, 0.2, 1.0, 1.2], window=2, floor=0.5)
    run = {**rep, "zero_std_first": 0.0, "zero_std_last": 0.5, "eval": {"chair_i": 0.1, "recall": 0.9}}
    rows = [{"name": "world0", "sft_eval": {"chair_i": 0.2, "recall": 0.9}, "plain": run, "remedy": run}]
    text = ec.table(rows, ec.summarize(rows))
    assert text.count("world0") == 3 and "collapsed" in text and "mean remedy" in text


def test_remedy_overrides_and_bad_pairs(ec, capsys):
    import argparse

    args = argparse.Namespace(remedy="clip_cov", remedy_set=["algo.clip_cov_ratio=0.05"])
    assert ec.remedy_overrides(args) == ["algo.loss_mode=clip_cov", "algo.clip_cov_ratio=0.02",
                                         "algo.clip_cov_ratio=0.05"]  # fmt: skip
    assert all(s.startswith("algo.") for sets in ec.REMEDIES.values() for s in sets)
    with pytest.raises(SystemExit) as err:
        ec.main(["--sft", "a", "b", "--data", "d"])
    assert err.value.code == 2 and "one --data (and --names) per --sft" in capsys.readouterr().err


def test_smoke_two_runs_on_a_tiny_model(ec, tmp_path, capsys):
    import json
    import warnings

    from tests.helpers.eval_model import make_data_dir, make_model_dir

    model = make_model_dir(tmp_path)
    data = make_data_dir(tmp_path, split="train")
    lines = (data / "notes.jsonl").read_text().splitlines()
    test = [json.dumps({**json.loads(x), "id": json.loads(x)["id"] + "t", "split": "test"}) for x in lines]
    (data / "notes.jsonl").write_text("\n".join(lines + test) + "\n")  # the same notes held out too
    out = tmp_path / "out"
    sets = ["data.notes=0", "data.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=6",
            "algo.overlong_penalty=true", "algo.overlong_cache=6"]  # fmt: skip
    argv = ["--sft", str(model), "--data", str(data), "--out", str(out), "--steps", "4", "--window", "2",
            "--eval-notes", "2", "--reward-notes", "2", "--set", *sets]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ec.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    row = summary["pairs"][0]
    assert summary["remedy_overrides"] == ec.REMEDIES["clip_cov"] and row["name"] == "world0"
    for run in ec.RUNS:
        assert row[run]["steps"] == 4 and len(row[run]["curves"]["entropy"]) == 4
        assert (out / "world0" / run / "eval.json").is_file() and 0 <= row[run]["eval"]["chair_i"] <= 1
        for split in ("train", "test"):  # the trained notes (data.notes=0: all 2) and the held-out ones
            x = row[run][f"sampled_reward_{split}"]
            assert x["gain"] == pytest.approx(x["mean"] - row[f"sampled_reward_{split}"]["mean"])
            assert row[f"sampled_reward_{split}"]["notes"] == 2
    assert summary["mean"]["remedy"]["pairs"] == 1 and (out / "entropy.png").stat().st_size > 0
    cfg = (out / "world0" / "remedy" / "config.yaml").read_text()
    assert "loss_mode: clip_cov" in cfg and "clip_cov_ratio: 0.02" in cfg
    assert "mean remedy" in capsys.readouterr().out


def test_reward_change_paired_golden(ec):
    before = {"units": [0.0, 1.0, -2.0, 3.0]}
    up = ec.reward_change(before, {"units": [0.5, 1.5, -1.5, 3.5]})  # every note +0.5: no spread
    assert up["gain"] == pytest.approx(0.5) and up["interval"] == pytest.approx([0.5, 0.5]) and up["rises"]
    flat = ec.reward_change(before, {"units": [1.0, 0.0, -2.0, 3.0]})  # +1 and -1: straddles 0
    assert flat["gain"] == pytest.approx(0.0) and flat["interval"][0] < 0 < flat["interval"][1]
    assert not flat["rises"]


def test_sampled_reward_scores_each_notes_group_with_common_seeds(ec, tmp_path):
    import json

    from mm.data.format import read_notes
    from rl.rewards import RewardConfig, score
    from tests.helpers.eval_model import make_data_dir, make_model_dir

    model, data = make_model_dir(tmp_path), make_data_dir(tmp_path, split="test")
    cfg = {
        "rollout": {"group_size": 3, "max_new_tokens": 6, "temperature": 0.5},
        "reward": {
            "coverage_weight": 1.0,
            "hallucination_weight": 3.5,
            "caption_weight": 1.0,
            "vocab": "world",
            "yesno_weight": 1.0,
        },
        "data": {"caption_prompt": "Describe the note."},
    }
    kw = {"split": "test", "notes": 2, "seed": 4, "reuse": True}
    a = ec.sampled_reward(model, str(data), cfg, cache=tmp_path / "a.json", **kw)
    b = ec.sampled_reward(model, str(data), cfg, cache=tmp_path / "b.json", **kw)
    assert a["units"] == b["units"] and a["notes"] == 2 and len(a["units"]) == 2  # same seeds, same draws
    assert a["mean"] == pytest.approx(sum(a["units"]) / 2)
    notes = read_notes(data, split="test")
    worst = [-3.5 * 2 * 6 for _ in notes]  # at most 6 tokens: a bounded penalty per caption
    assert all(w <= u <= 1.0 for w, u in zip(worst, a["units"]))
    assert score("a fork and a cup", sorted(notes[0].categories), cfg=RewardConfig()).total == 1.0
    kept = {"split": "test", "limit": 2, "notes": 2, "seed": 4, "mean": 9.0, "units": [9, 9]}
    (tmp_path / "a.json").write_text(json.dumps(kept))
    assert ec.sampled_reward(model, str(data), cfg, cache=tmp_path / "a.json", **kw)["mean"] == 9.0  # reused
