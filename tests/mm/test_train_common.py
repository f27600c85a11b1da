"""mm.train.common: data order, metrics, plots, atomic checkpoints and resume equality."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from mm.train import common


def test_batch_indices_pure_and_epochwise_permutations():
    a = [common.batch_indices(10, 4, seed=3, step=s) for s in range(5)]
    b = [common.batch_indices(10, 4, seed=3, step=s) for s in range(5)]
    assert a == b
    flat = [i for batch in a for i in batch]  # 20 indices = 2 epochs
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert common.batch_indices(10, 4, seed=4, step=0) != a[0]
    with pytest.raises(ValueError, match="batch_size"):
        common.batch_indices(10, 0, seed=0, step=0)


def test_length_grouped_batches_cover_each_epoch_and_pad_less():
    gen = torch.Generator().manual_seed(0)
    short, long = torch.randint(30, 40, (300,), generator=gen), torch.randint(100, 200, (300,), generator=gen)
    lengths = torch.cat([short, long])
    lengths = lengths[torch.randperm(600, generator=gen)].tolist()
    g = common.LengthGroupedBatches(lengths, 16, seed=5, megabatch=10)
    assert g.per_epoch == 37  # 600 // 16: 8 samples left out, a different 8 each epoch
    for epoch in range(2):
        flat = [i for s in range(epoch * 37, (epoch + 1) * 37) for i in g.indices(s)]
        assert len(flat) == len(set(flat)) == 37 * 16
    seen = [{i for s in range(e * 37, (e + 1) * 37) for i in g.indices(s)} for e in (0, 1)]
    left_out = [set(range(600)) - s for s in seen]
    assert left_out[0] != left_out[1]
    # a pure function of (seed, step): a fresh object, steps out of order, a new epoch and back
    h = common.LengthGroupedBatches(lengths, 16, seed=5, megabatch=10)
    assert [h.indices(s) for s in (40, 3, 74, 3)] == [g.indices(s) for s in (40, 3, 74, 3)]
    assert common.LengthGroupedBatches(lengths, 16, seed=6, megabatch=10).indices(0) != g.indices(0)

    def padded(batches):  # tokens a right-padded batch holds
        return sum(len(b) * max(lengths[i] for i in b) for b in batches)

    grouped = [g.indices(s) for s in range(37)]
    plain = [common.batch_indices(600, 16, seed=5, step=s) for s in range(37)]
    assert padded(grouped) < 0.75 * padded(plain)
    # a batch holds only short or only long samples (but where a megabatch turns); short and long batches
    # come in random order
    kinds = [{lengths[i] >= 100 for i in b} for b in grouped]
    assert sum(len(k) == 1 for k in kinds) >= 37 - 4  # at most one mixed batch per megabatch
    firsts = [next(iter(k)) for k in kinds]
    assert 5 < sum(firsts) < 32 and firsts != sorted(firsts, reverse=True)
    with pytest.raises(ValueError, match="cannot fill one batch"):
        common.LengthGroupedBatches([3, 4], 4, seed=0)


def test_shard():
    assert common.shard([5, 6, 7, 8], rank=1, world_size=2) == [7, 8]
    with pytest.raises(ValueError, match="divisible"):
        common.shard([1, 2, 3], rank=0, world_size=2)


def test_metrics_logger_resume_drops_later_records(tmp_path):
    path = tmp_path / "m.jsonl"
    log = common.MetricsLogger(path)
    for s in range(1, 6):
        log.log({"step": s, "loss": torch.tensor(float(s))})
    assert [r["loss"] for r in common.read_metrics(path)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    common.MetricsLogger(path, resume_step=3).log({"step": 4, "loss": 40.0})
    assert [(r["step"], r["loss"]) for r in common.read_metrics(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]
    common.MetricsLogger(tmp_path / "off.jsonl", enabled=False).log({"step": 1})
    assert not (tmp_path / "off.jsonl").exists()


def test_plot_metrics_writes_png(tmp_path):
    recs = [{"step": s, "loss": 1 / s} for s in range(1, 5)]
    out = common.plot_metrics(recs, ["loss", "missing"], tmp_path / "p.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.3), torch.nn.Linear(4, 1))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return m, opt, sched


DATA_X = torch.randn(32, 3, generator=torch.Generator().manual_seed(1))
DATA_Y = DATA_X.sum(1, keepdim=True)


def _train(m, opt, sched, start, stop, ckpt_dir=None, every=None):
    for step in range(start, stop):
        idx = common.batch_indices(32, 8, seed=7, step=step)
        loss = ((m(DATA_X[idx]) - DATA_Y[idx]) ** 2).mean()  # dropout uses the torch RNG
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if ckpt_dir is not None and (step + 1) % every == 0:
            common.save_checkpoint(
                ckpt_dir, step=step + 1, model=m, optimizer=opt, scheduler=sched, keep_last=2
            )


def test_checkpoint_resume_is_bit_identical(tmp_path):
    common.seed_everything(0)
    m1, o1, s1 = _model()
    _train(m1, o1, s1, 0, 10)

    common.seed_everything(0)
    m2, o2, s2 = _model()
    _train(m2, o2, s2, 0, 6, tmp_path, every=2)  # "killed" after step 6
    random.random(), np.random.rand()  # noqa: NPY002, torch.rand(3)  # RNG drift a fresh process would have

    m3, o3, s3 = _model()
    last = common.find_last_checkpoint(tmp_path)
    assert last is not None and last.name == "step-00000006"
    info = common.load_checkpoint(last, model=m3, optimizer=o3, scheduler=s3)
    _train(m3, o3, s3, info["step"], 10)
    for a, b in zip(m1.state_dict().values(), m3.state_dict().values()):
        assert torch.equal(a, b)
    assert s3.last_epoch == s1.last_epoch


def test_checkpoint_keep_last_and_ignores_temp(tmp_path):
    m, opt, sched = _model()
    for s in (1, 2, 3):
        common.save_checkpoint(tmp_path, step=s, model=m, optimizer=opt, config={"a": 1}, extra={"best": 0.5})
    assert [p.name for p in common.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    (tmp_path / ".tmp-step-00000009").mkdir()  # a save killed half-way
    assert common.find_last_checkpoint(tmp_path).name == "step-00000003"
    info = common.load_checkpoint(tmp_path / "step-00000003", model=m)
    assert info.pop("optimizer")["param_groups"][0]["params"] == [0, 1, 2, 3]  # saved state
    assert info == {"step": 3, "config": {"a": 1}, "extra": {"best": 0.5}}
    assert common.find_last_checkpoint(tmp_path / "nope") is None
    with pytest.raises(FileNotFoundError, match="state.json"):
        common.load_checkpoint(tmp_path, model=m)


def test_checkpoint_tied_weights_and_rng_roundtrip(tmp_path):
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    m = torch.nn.ModuleDict({"emb": emb, "head": head})
    common.seed_everything(5)
    path = common.save_checkpoint(tmp_path, step=1, model=m)
    want = (random.random(), float(np.random.rand()), torch.rand(1).item())  # noqa: NPY002
    with torch.no_grad():
        emb.weight.zero_()
    common.load_checkpoint(path, model=m)
    assert m["head"].weight is m["emb"].weight and m["emb"].weight.abs().sum() > 0
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == want  # noqa: NPY002


def test_read_metrics_drops_a_torn_last_line_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "lo')
    with pytest.warns(common.TornMetricsWarning, match=rf"{path}:3: dropped a torn last line"):
        recs = common.read_metrics(path)
    assert recs == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}]
    path.write_text('{"step": 1, "loss": 2.5}\n\n')  # blank lines are no records, and no warning
    assert common.read_metrics(path) == [{"step": 1, "loss": 2.5}]


def test_read_metrics_torn_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    from mm.errors import UserError

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "lo\n{"step": 3, "loss": 2.0}\n')
    with pytest.raises(UserError, match=rf"{path}:2: not a metrics record"):
        common.read_metrics(path)
    path.write_text('{"step": 1}\n[1, 2]\n{"step": 3}\n')  # valid JSON but not a record
    with pytest.raises(UserError, match=rf"{path}:2: not a metrics record .*list"):
        common.read_metrics(path)


def test_resumed_logger_truncates_the_torn_tail_before_appending(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "lo')
    with pytest.warns(common.TornMetricsWarning):
        logger = common.MetricsLogger(path, resume_step=2)
    logger.log({"step": 3, "loss": torch.tensor(2.0)})
    assert (
        path.read_text() == '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "loss": 2.0}\n'
    )
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc (Linux)")
def test_checkpoint_is_fsynced_files_then_folder_before_the_rename(tmp_path, monkeypatch):
    from mm.train import checkpoints

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    model = torch.nn.Linear(3, 2)
    final = common.save_checkpoint(tmp_path / "ck", step=7, model=model, config={"a": 1})
    tmp = str(tmp_path / "ck" / ".tmp-step-00000007")
    rename = events.index(("rename", tmp))
    synced = [path for kind, path in events[:rename] if kind == "fsync"]
    files = {f"{tmp}/{n}" for n in ("model.safetensors", "state.safetensors", "state.json")}
    assert set(synced[:3]) == files and synced[3] == tmp  # every file, then the folder, before the rename
    assert events[rename + 1] == ("fsync", str(tmp_path / "ck"))  # then the parent, so the rename lasts
    assert final.name == "step-00000007" and checkpoints.find_last_checkpoint(tmp_path / "ck") == final
