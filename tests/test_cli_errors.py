"""Bad input on the command line: one clear line naming the key, flag or value, exit code 2, no
traceback, nothing written. (Every check here fails before any model is loaded.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from kdlab.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = str(REPO_ROOT / "params" / "tiny.yaml")


def _refused(capsys, tmp_path, argv, *needles):
    outputs = tmp_path / "out"
    assert main(["--outputs", str(outputs), *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    assert not outputs.exists()


@pytest.mark.parametrize("override,needle", [
    ("distill.temperature=nan", "distill.temperature: nan is not a finite number"),
    ("eval.temperature=.inf", "eval.temperature: inf is not a finite number"),
    ("student_pretrain.lr=.nan", "student_pretrain.lr: nan is not a finite number"),
    ("student_pretrain.lr=0", "student_pretrain.lr: 0.0 must be above 0.0"),
    ("rlvr.lr=0", "rlvr.lr: 0.0 must be above 0.0"),
    ("grid.lrs=[1e-4", "--set grid.lrs=[1e-4: the value is not valid YAML"),
    ("distill.steps.foo=1", "--set distill.steps.foo: distill.steps is not a mapping"),
    ("grid.lrs.0=1", "--set grid.lrs.0: grid.lrs is not a mapping"),
    ("grid.seeds=[-1]", "grid.seeds: -1 is below the minimum 0"),
    ("nokey", "--set expects KEY=VALUE"),
])
def test_bad_overrides_are_one_line(capsys, tmp_path, override, needle):
    _refused(capsys, tmp_path, ["study", TINY, "--set", override], needle)


@pytest.mark.parametrize("flags,needle", [
    (["--lr", "-1"], "--lr: -1.0 must be in (0, 1)"),
    (["--lr", "0"], "--lr: 0.0 must be in (0, 1)"),
    (["--lr", "nan"], "--lr: nan is not a finite number"),
    (["--lr", "inf"], "--lr: inf is not a finite number"),
    (["--lr", "1e30"], "--lr: 1e+30 must be in (0, 1)"),
    (["--kl", "bogus"], "--kl: 'bogus' is not a valid choice"),
    (["--lam", "99"], "--lam: 99.0 is outside [-3, 3]"),
    (["--seed", "-1"], "--seed: -1 is below the minimum 0"),
    (["--task", "countdown-9"], "--task 'countdown-9'"),
    (["--task", "kb-mc"], "--task 'kb-mc': profile"),
])
def test_distill_flags_are_validated_like_a_profile(capsys, tmp_path, flags, needle):
    _refused(capsys, tmp_path, ["distill", TINY, *flags], needle)


def test_workers_and_empty_or_duplicated_profiles(capsys, tmp_path):
    _refused(capsys, tmp_path, ["study", TINY, "--workers", "0"], "--workers 0: must be at least 1")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    _refused(capsys, tmp_path, ["study", str(empty)], "empty.yaml: the profile is empty")
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: a\ndistill: {steps: 2}\ndistill: {steps: 3}\n")
    _refused(capsys, tmp_path, ["study", str(dup)], "dup.yaml: not valid YAML", "duplicate key 'distill'")


def test_outputs_is_accepted_after_the_subcommand(capsys, tmp_path):
    outputs = tmp_path / "late"
    assert main(["study", TINY, "--outputs", str(outputs), "--set", "grid.kls=[bogus]"]) == 2
    assert "grid.kls" in capsys.readouterr().err and not outputs.exists()
    with pytest.raises(SystemExit):
        main(["study", "--help"])
    assert "--outputs" in capsys.readouterr().out
