"""`rl pipeline --world-seeds W... --seeds N`: the table over world x training seeds, golden numbers on fake
run folders (mean, sample sd, Student-t interval, targets, every run listed), the t quantiles, the world seed
wiring and the CLI's --table-only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mm.config import load_config
from mm.errors import UserError
from rl.cli import main
from rl.pipeline import PipelineConfig
from rl.pipeline_table import run_table, summarize, t_interval, t_quantile, table_markdown, write_table

ROOT = Path(__file__).resolve().parents[2]


def _eval(chair_i: float, recall: float, length: float, f1: float, attr: float) -> dict:
    """The fields of an eval record the table reads."""
    return {
        "chair": {
            "recall": recall,
            "chair_i": chair_i,
            "chair_s": 0.4,
            "mean_length": length,
            "n_mentions": 100,
        },
        "pope": {"adversarial": {"f1": f1, "yes_ratio": 0.5}},
        "claims": {"attribute": {"rate": attr}},
        "n_notes": 200,
    }


def _put(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


SFT = {0: _eval(0.10, 0.80, 40.0, 0.90, 0.50), 1: _eval(0.20, 0.90, 50.0, 0.95, 0.40)}
DPO = {  # (world seed, training seed) -> eval: cuts CHAIR_i by 60, 50, 70, 40 %
    (0, 0): _eval(0.04, 0.79, 42.0, 0.905, 0.30),
    (0, 1): _eval(0.05, 0.78, 38.0, 0.89, 0.35),
    (1, 0): _eval(0.06, 0.87, 55.0, 0.96, 0.20),
    (1, 1): _eval(0.12, 0.90, 50.0, 0.95, 0.32),
}


@pytest.fixture
def fake_runs(tmp_path):
    """Two world folders as ``rl pipeline --seeds 2`` leaves them (DPO), GRPO on world 0's main run only."""
    dirs = {}
    for w in (0, 1):
        d = tmp_path / f"world{w}"
        dirs[w] = d
        _put(d / "eval_sft" / "eval.json", SFT[w])
        _put(d / "dpo" / "stage.json", {"config": {"train": {"seed": 0}}})
        _put(d / "eval_dpo" / "eval.json", DPO[(w, 0)])
        _put(d / "seeds" / "1" / "eval_dpo" / "eval.json", DPO[(w, 1)])
    _put(dirs[0] / "eval_grpo" / "eval.json", _eval(0.03, 0.81, 40.0, 0.90, 0.25))
    return tmp_path, dirs


def test_table_golden_on_fake_runs(fake_runs):
    out, dirs = fake_runs
    dpo = write_table(out, dirs, ["dpo"], title="t")["dpo"]
    assert [(r["world_seed"], r["train_seed"]) for r in dpo["runs"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["chair_i_rel_change"] for r in dpo["runs"]] == pytest.approx([-0.6, -0.5, -0.7, -0.4])
    assert [r["attribute_rate_rel_change"] for r in dpo["runs"]] == pytest.approx([-0.4, -0.3, -0.5, -0.2])
    assert [r["recall_change_points"] for r in dpo["runs"]] == pytest.approx([-1.0, -2.0, -3.0, 0.0])
    assert [r["length_change_pct"] for r in dpo["runs"]] == pytest.approx([5.0, -5.0, 10.0, 0.0])
    f1 = [r["pope_adversarial_f1_change_points"] for r in dpo["runs"]]
    assert f1 == pytest.approx([0.5, -1.0, 1.0, 0.0])
    ch = dpo["stats"]["chair_i_rel_change"]
    assert ch["n"] == 4 and ch["mean"] == pytest.approx(-0.55)
    assert ch["sd"] == pytest.approx(0.1290994449)  # sample sd: sqrt(0.05 / 3)
    assert ch["interval"] == pytest.approx([-0.55 - 0.2053972, -0.55 + 0.2053972])  # 3.182 * sd / 2
    assert dpo["stats"]["recall_change_points"]["mean"] == pytest.approx(-1.5)
    assert dpo["stats"]["length_change_pct"]["mean"] == pytest.approx(2.5)
    met = {t["key"]: (t["met"], t["met_at_interval"]) for t in dpo["targets"]}
    assert met == {
        "chair_i_rel_change": (True, False),  # -55% at the mean; the interval reaches -34%
        "attribute_rate_rel_change": (True, False),
        "recall_change_points": (True, False),
        "length_change_pct": (True, False),
        "pope_adversarial_f1_change_points": (True, False),
        "every_run_chair_i_rel_change": (False, None),  # one run cut only 40%
    }
    assert (dpo["targets_met"], dpo["targets_total"]) == (5, 6)
    saved = json.loads((out / "table.json").read_text())
    assert saved["world_seeds"] == [0, 1] and saved["methods"]["dpo"]["targets_met"] == 5
    md = (out / "table.md").read_text()
    assert "| dpo | 4 | -55.0% +- 12.9% [-75.5%, -34.5%] |" in md
    assert "| dpo | 1 | 1 | -40.0% | -20.0% | +0.0 | +0.0 | +0.0 |" in md  # every run is listed
    assert "| dpo | every_run_chair_i_rel_change | every run <= -45% | -40.0% | **no** | n/a |" in md
    assert "| dpo | **met** | | 5 of 6 | | |" in md


def test_one_run_has_no_sd_and_no_interval(fake_runs):
    _, dirs = fake_runs
    from rl.pipeline_table import collect_runs

    grpo = summarize(collect_runs({0: dirs[0]}, ["grpo"]))["grpo"]
    assert len(grpo["runs"]) == 1 and grpo["runs"][0]["train_seed"] is None  # no stage.json: seed unknown
    st = grpo["stats"]["chair_i_rel_change"]
    assert st["mean"] == pytest.approx(-0.7) and st["sd"] is None and st["interval"] is None
    t = {t["key"]: t for t in grpo["targets"]}
    assert t["chair_i_rel_change"]["met"] and t["chair_i_rel_change"]["met_at_interval"] is None
    assert "| grpo | 1 | -70.0% +- n/a |" in table_markdown({"grpo": grpo}, title="t")


def test_t_quantiles_and_interval():
    assert t_quantile(1) == 12.706 and t_quantile(3) == 3.182 and t_quantile(20) == 2.086
    for df, want in ((21, 2.0796), (30, 2.0423), (60, 2.0003), (120, 1.9799), (10_000, 1.9602)):
        assert t_quantile(df) == pytest.approx(want, abs=1e-3)
    assert t_interval([1.0]) is None and t_interval([]) is None
    assert t_interval([1.0, 3.0]) == pytest.approx([2.0 - 12.706, 2.0 + 12.706])  # sd sqrt(2), n 2
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0)


def test_world_seeds_run_the_pipeline_per_world_folder(fake_runs, monkeypatch):
    out, _ = fake_runs
    monkeypatch.chdir(ROOT)
    cfg = load_config(PipelineConfig, "configs/rl/pipeline_nogt.yaml", ["post=[dpo]"])
    calls = []

    def fake_run(c, folder, *, seeds, **kwargs):
        calls.append((c.world.overrides, Path(folder).name, seeds, kwargs))

    table = run_table(cfg, out, [0, 1], seeds=2, run=fake_run, fresh=False)
    assert calls == [(["seed=0"], "world0", 2, {"fresh": False}), (["seed=1"], "world1", 2, {"fresh": False})]
    assert len(table["dpo"]["runs"]) == 4 and cfg.world.overrides == []  # the config itself is untouched
    assert "(no ground truth)" in (out / "table.md").read_text()
    for bad in ([], [0, 0], [-1]):
        with pytest.raises(UserError, match="--world-seeds"):
            run_table(cfg, out, bad, seeds=1, run=fake_run)


def test_cli_table_only_and_errors(fake_runs, capsys):
    out, _ = fake_runs
    argv = ["pipeline", "--config", str(ROOT / "configs/rl/pipeline_nogt.yaml"), "--out", str(out)]
    assert main([*argv, "--world-seeds", "0", "1", "--table-only", "--set", "post=[dpo]"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "dpo": {"runs": 4, "targets_met": 5, "targets_total": 6}
    }
    assert main([*argv, "--world-seeds", "0", "2", "--table-only"]) == 2  # world 2 was never run
    assert "world2/eval_sft/eval.json is missing" in capsys.readouterr().err
    assert main([*argv, "--table-only"]) == 2
    assert "--table-only and --against need --world-seeds" in capsys.readouterr().err


def test_against_another_table_gives_the_difference_of_means(fake_runs, tmp_path):
    out, dirs = fake_runs
    write_table(out / "gt", {0: dirs[0]}, ["dpo", "grpo"], title="with ground truth")
    table = write_table(out / "nogt", dirs, ["dpo"], title="without", other=out / "gt")
    assert len(table["dpo"]["runs"]) == 4
    saved = json.loads((out / "nogt" / "table.json").read_text())["against"]
    diff = saved["mean_difference"]
    assert set(diff) == {"dpo"} and saved["table"] == str(out / "gt")  # grpo is in one table only
    assert diff["dpo"]["chair_i_rel_change"] == pytest.approx(-0.55 - (-0.55))  # world 0: -60% and -50%
    assert diff["dpo"]["recall_change_points"] == pytest.approx(-1.5 - (-1.5))
    assert diff["dpo"]["attribute_rate_rel_change"] == pytest.approx(-0.35 - (-0.35))
    assert diff["dpo"]["length_change_pct"] == pytest.approx(2.5 - 0.0)
    assert diff["dpo"]["pope_adversarial_f1_change_points"] == pytest.approx(0.125 - (-0.25))
    md = (out / "nogt" / "table.md").read_text()
    assert f"## Against {out / 'gt'}" in md and "| dpo | +0.0% | +0.0% | +0.0 | +2.5 | +0.4 |" in md
    with pytest.raises(UserError, match="no table.json there"):
        write_table(out / "x", dirs, ["dpo"], title="t", other=tmp_path / "missing")
