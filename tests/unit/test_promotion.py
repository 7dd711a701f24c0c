"""gem.train.promotion: a run of day D warm-starts from the newest model promoted for a day before D, never
from D's own or a later day's; a rerun of an old day never moves the current model back."""

from __future__ import annotations

from pathlib import Path

from gem.train import checkpoint, promotion
from tests.support import tiny_trainer


def test_warm_start_only_from_earlier_days_and_reruns_never_move_the_current_model_back(tmp_path: Path) -> None:
    root, arch = tmp_path / "ckpt", "kunlun"
    ckpt = {}
    for name in ("d3", "d5", "d3-rerun"):
        ckpt[name] = tiny_trainer(root / name).fit(steps=1).checkpoint
    assert promotion.warm_start_for(root, arch, "2026-01-03") is None and promotion.current(root, arch) is None
    promotion.promote(root, arch, "2026-01-03", ckpt["d3"], 1)
    promotion.promote(root, arch, "2026-01-05", ckpt["d5"], 1)
    assert promotion.warm_start_for(root, arch, "2026-01-03") is None  # not from its own day's model
    assert promotion.warm_start_for(root, arch, "2026-01-04").checkpoint == ckpt["d3"]
    assert promotion.warm_start_for(root, arch, "2026-01-05").checkpoint == ckpt["d3"]  # not D's own
    assert promotion.warm_start_for(root, arch, "2026-01-09").checkpoint == ckpt["d5"]
    # Backfilling day 3 replaces day 3's model; the current one stays day 5's.
    promotion.promote(root, arch, "2026-01-03", ckpt["d3-rerun"], 1)
    assert promotion.current(root, arch).checkpoint == ckpt["d5"]
    assert [p.mix_ds for p in promotion.promotions(root, arch)] == ["2026-01-03", "2026-01-05"]
    assert promotion.warm_start_for(root, arch, "2026-01-04").checkpoint == ckpt["d3-rerun"]
    assert promotion.promotions(root, "hstu") == []  # one history per architecture


def test_a_trainer_warm_starts_from_the_promoted_checkpoint_not_the_run_folders_latest(tmp_path: Path) -> None:
    import torch

    day1 = tiny_trainer(tmp_path / "day1")
    promoted = day1.fit(steps=4).checkpoint  # step 4 is promoted ...
    weights_at_4 = {k: v.clone() for k, v in day1.task.state_dict().items()}
    day1.fit(steps=8)  # ... then a resumed rerun adds step 8 to the same folder
    assert checkpoint.latest(tmp_path / "day1").name == "step-00000008"
    day2 = tiny_trainer(tmp_path / "day2")
    assert day2.warm_start(promoted) == promoted
    for name, tensor in weights_at_4.items():
        assert torch.equal(tensor, day2.task.state_dict()[name]), name


def test_a_pointer_to_a_folder_outside_the_checkpoint_root_is_refused(tmp_path: Path) -> None:
    import json

    import pytest

    # A checkpoint's metadata is unpickled on load: only folders under the root this pipeline writes
    # may be named by a pointer, whether it is written or read (a hand-edited or planted file).
    root, arch = tmp_path / "ckpt", "kunlun"
    inside = tiny_trainer(root / "kunlun-2026-01-03").fit(steps=1).checkpoint
    outside = tiny_trainer(tmp_path / "elsewhere").fit(steps=1).checkpoint
    promotion.promote(root, arch, "2026-01-03", inside, 1)
    with pytest.raises(promotion.PromotionError, match="outside the checkpoint root"):
        promotion.promote(root, arch, "2026-01-04", outside, 1)
    pointer = root / "promoted" / arch / "2026-01-05.json"
    for planted in (outside, root / ".." / "elsewhere" / outside.name):
        pointer.write_text(json.dumps({"arch": arch, "mix_ds": "2026-01-05", "checkpoint": str(planted), "step": 1}))
        with pytest.raises(promotion.PromotionError, match=f"{pointer}.*outside the checkpoint root"):
            promotion.warm_start_for(root, arch, "2026-01-09")
    pointer.unlink()
    assert promotion.warm_start_for(root, arch, "2026-01-05").checkpoint == inside


def test_a_pointer_names_its_checkpoint_relative_to_the_root(tmp_path: Path, monkeypatch) -> None:
    # `python -m gem.train --run-dir lakehouse/_checkpoints/x` from the repository: the promoted model
    # must be found from any working directory, and after the lakehouse folder is moved whole.
    root, arch = tmp_path / "lake" / "ckpt", "kunlun"
    tiny_trainer(root / "run").fit(steps=1)
    monkeypatch.chdir(tmp_path)
    relative = Path("lake/ckpt/run") / checkpoint.latest(root / "run").name
    promotion.promote(root, arch, "2026-01-03", relative, 1)
    monkeypatch.chdir(root / "run")
    assert promotion.current(root, arch).checkpoint.resolve() == (tmp_path / relative).resolve()
    (tmp_path / "lake").rename(tmp_path / "moved")
    moved = tmp_path / "moved" / "ckpt"
    assert promotion.current(moved, arch).checkpoint == moved / "run" / relative.name
