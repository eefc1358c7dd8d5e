"""Incidental style transfer on countdown: styled references, the instruction, the detector."""
import math
import random

import pytest
import torch

from kdlab.engine.data import ProblemPool
from kdlab.models.toy import build_model
from kdlab.evaluation.style import (StyledCountdownTask, detect_style, student_prompt, style_adoption, style_report,
                                    style_teacher_tasks, teacher_prompt)
from kdlab.tasks.base import Problem
from kdlab.tasks.countdown import CountdownTask, max_completion_chars
from kdlab.models.tokenizer import check_text

TO_PLAIN = str.maketrans({"p": "+", "m": "-", "t": "*", "d": "/"})


@pytest.fixture(scope="module")
def cases():
    """(variant, trace) -> (plain task, alt task, problems)."""
    out = {}
    for variant, trace, n in (("countdown-3", "steps", 150), ("countdown-3", "search", 60), ("countdown-4", "steps", 40)):
        plain = StyledCountdownTask(variant, "plain", instructed=False, trace=trace)
        alt = StyledCountdownTask(variant, "alt", instructed=True, trace=trace)
        out[(variant, trace)] = (plain, alt, plain.problems("train", n, seed=0))
    return out


def _refs(task, problems, seed=0):
    return [task.reference(p, random.Random(f"{seed}:{p.key}")) for p in problems]


def test_plain_references_are_the_countdown_references(cases):
    for (variant, trace), (plain, _, problems) in cases.items():
        base = CountdownTask(variant, trace=trace)
        assert _refs(plain, problems) == _refs(base, problems)


def test_alt_references_differ_only_in_operator_letters(cases):
    for plain, alt, problems in cases.values():
        for p_ref, a_ref in zip(_refs(plain, problems), _refs(alt, problems)):
            trace, answer = a_ref.split("#")
            assert len(a_ref) == len(p_ref)
            assert trace.translate(TO_PLAIN) + "#" + answer == p_ref
            assert not set(trace) & set("+*") and set(trace) & set("pmtd")
            assert answer == p_ref.split("#")[1]  # the final answer is a normal expression


def test_detector_is_right_on_every_reference(cases):
    for plain, alt, problems in cases.values():
        assert [detect_style(r) for r in _refs(plain, problems)] == ["plain"] * len(problems)
        assert [detect_style(r) for r in _refs(alt, problems)] == ["alt"] * len(problems)


def test_both_styles_verify(cases):
    for plain, alt, problems in cases.values():
        alt_problems = alt.problems("train", len(problems), seed=0)
        assert [p.key for p in alt_problems] == [p.key for p in problems]
        assert all(plain.score(p, r) == 1.0 for p, r in zip(problems, _refs(plain, problems)))
        assert all(alt.score(p, r) == 1.0 for p, r in zip(alt_problems, _refs(alt, alt_problems)))
        # the verifier reads only the answer: a plain completion scores on the alt task too
        assert all(alt.score(p, r) == 1.0 for p, r in zip(alt_problems, _refs(plain, problems)))


def test_fractional_intermediates_are_styled_and_detected():
    # cd4:3,25,40,85>16 has no solution with non-negative integer intermediates (found by search
    # over countdown-4e), so its reference passes through fractions such as 17/5.
    data = {"numbers": [40, 3, 25, 85], "target": 16}
    problem = Problem(task="countdown-4", key="cd4:3,25,40,85>16", prompt="c40 3 25 85>16:", data=data)
    plain = StyledCountdownTask("countdown-4", "plain", instructed=False)
    alt = StyledCountdownTask("countdown-4", "alt", instructed=True)
    for seed in range(5):
        p_ref, a_ref = plain.reference(problem, random.Random(seed)), alt.reference(problem, random.Random(seed))
        assert "/" in p_ref.split("#")[0] and "/" in a_ref.split("#")[0]
        assert (detect_style(p_ref), detect_style(a_ref)) == ("plain", "alt")
        assert a_ref.split("#")[0].translate(TO_PLAIN) == p_ref.split("#")[0]
        assert plain.score(problem, p_ref) == alt.score(problem, a_ref) == 1.0


@pytest.mark.parametrize("text,style", [
    ("34+56=90,90-12=78#(34+56)-12", "plain"),
    ("34p56=90,90m12=78#(34+56)-12", "alt"),
    ("3-7=-4,-4*-2=8#(3-7)*-2", "plain"),  # negative values keep their sign in both styles
    ("3m7=-4,-4t-2=8#x", "alt"),
    ("7d2=7/2,7/2t4=14#7/2*4", "alt"),  # fractions keep their slash in alt
    ("7/2=7/2,7/2*4=14#7/2*4", "plain"),
    ("12t3=36!;12p3=15,15m5=10#12+3-5", "alt"),  # search trace: failed attempts count too
    ("34p56=90", "alt"),  # no answer yet: the trace alone decides
    ("34+56=90,90m12=78#(34+56)-12", "none"),  # mixed styles
    ("34+56=90,,90-12=78#1", "none"),  # empty step
    ("34 + 56 = 90#90", "none"),
    ("34p56=90,90m1", "none"),  # truncated step
    ("34p+56=90#1", "none"),
    ("#(34+56)-12", "none"),  # direct: no trace
    ("", "none"),
    ("hello world", "none"),
    ("ptmd=p#", "none"),
    ("!;!;#1", "none"),
])
def test_detector_on_hand_written_text(text, style):
    assert detect_style(text) == style


def test_style_adoption_counts():
    share, counts = style_adoption(["1p2=3#1+2", "1p2=3#1+2", "1+2=3#1+2", "junk", "#1+2"])
    assert share == pytest.approx(2 / 3) and counts == {"plain": 1, "alt": 2, "none": 2}
    share, counts = style_adoption(["junk"])
    assert math.isnan(share) and counts == {"plain": 0, "alt": 0, "none": 1}
    assert style_adoption([]) [1] == {"plain": 0, "alt": 0, "none": 0}


def test_instructed_prompt_differs_only_by_the_instruction(cases):
    plain, alt, problems = cases[("countdown-3", "steps")]
    base = CountdownTask("countdown-3").problems("train", len(problems), seed=0)
    instructed = alt.problems("train", len(problems), seed=0)
    for b, p, a in zip(base, problems, instructed):
        assert p.prompt == b.prompt  # the uninstructed styled task keeps the student's prompt
        assert a.prompt == teacher_prompt(b) == teacher_prompt(a)
        assert len(a.prompt) == len(b.prompt)
        assert [i for i, (x, y) in enumerate(zip(a.prompt, b.prompt)) if x != y] == [0]
        assert (a.prompt[0], b.prompt[0]) == ("C", "c")
        assert student_prompt(a) == student_prompt(b) == b.prompt
        assert alt.teacher_prompt(b) == a.prompt
        check_text(a.prompt, "prompt")
        assert a.prompt.endswith(":") and a.data == b.data and a.key == b.key


def test_length_bounds_and_ascii(cases):
    for (variant, trace), (plain, alt, problems) in cases.items():
        bound = max_completion_chars(int(variant[-1]), trace)
        assert plain.max_new_tokens == alt.max_new_tokens == bound
        for r in _refs(plain, problems) + _refs(alt, problems):
            assert len(r) <= bound
            check_text(r, "reference")


def test_names_keep_pools_apart():
    tasks = [t for t, _ in style_teacher_tasks("countdown-3", alt_share=0.25, weight=2.0)]
    assert [t.name for t in tasks] == ["countdown-3-plain", "countdown-3-alt-instr"]
    assert [w for _, w in style_teacher_tasks("countdown-3", alt_share=0.25, weight=2.0)] == [1.5, 0.5]
    pools = [ProblemPool(t, "train", 20, seed=0) for t in tasks]
    assert {p.prompt[0] for p in pools[0].problems} == {"c"}
    assert {p.prompt[0] for p in pools[1].problems} == {"C"}


@pytest.mark.parametrize("kwargs,name", [({"style": "spanish"}, "style"), ({"trace": "direct"}, "trace"),
                                         ({"variant": "countdown-5"}, "variant"), ({"instructed": 1}, "instructed")])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StyledCountdownTask(**kwargs)


def test_bad_prompts_and_mixture():
    plain = CountdownTask("countdown-3").problems("test", 1)[0]
    other = type(plain)(task="x", key="k", prompt="a12+3:", data={})
    with pytest.raises(ValueError, match="prompt"):
        teacher_prompt(other)
    with pytest.raises(ValueError, match="prompt"):
        student_prompt(other)
    with pytest.raises(ValueError, match="alt_share"):
        style_teacher_tasks(alt_share=1.0)


def test_style_report_on_a_nano_model():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        task = StyledCountdownTask("countdown-3", "alt", instructed=True)
        problems = task.problems("test", 6)
        model = build_model("llama", "nano", seed=0)
        rep = style_report(model, task, problems)
        rep_t = style_report(model, task, problems, prompt=teacher_prompt)
    finally:
        torch.set_num_threads(before)
    assert rep["n"] == 6 and rep["plain"] + rep["alt"] + rep["none"] == 6
    assert 0 <= rep["accuracy"] <= 1 and 0 <= rep["styled_share"] <= 1
    assert set(rep_t) == set(rep)


def test_the_style_measure_on_known_completions_feeds_finding_12():
    """Issue 43's check of finding 12b's statistic of exactly 0: known "Spanish" (the teacher's
    letter operators) and "English" (plain) completions, in the toy notation and in natural
    language, give the shares the scoreboard reads; a configuration whose outputs are all plain
    is the 0 of 12b, and its verdict is 'not reproduced' because that 0 is the measure, not a gap."""
    import pandas as pd

    from kdlab.analysis import findings
    from kdlab.analysis.table import prepare_results

    spanish, english = "34p56=90,90m12=78#(34+56)-12", "34+56=90,90-12=78#(34+56)-12"
    assert style_adoption([spanish] * 3 + [english]) == (0.75, {"plain": 1, "alt": 3, "none": 0})
    nl_spanish, nl_english = "48m35=13, 54p13=67. Answer: 54+48-35", "48-35=13, 54+13=67. Answer: 54+48-35"
    assert detect_style(nl_spanish, natural=True) == "alt" and detect_style(nl_english, natural=True) == "plain"
    outputs = {("off", "forward"): [spanish] * 198 + ["junk"] * 2, ("on", "forward"): [spanish] * 184 + [english] * 16,
               ("off", "reverse"): [english] * 196 + ["junk"] * 4, ("on", "reverse"): [english] * 199 + [spanish]}
    shares = {k: style_adoption(v)[0] for k, v in outputs.items()}
    assert shares[("off", "forward")] == 1.0 and shares[("off", "reverse")] == 0.0
    assert shares[("on", "forward")] == pytest.approx(184 / 200) and shares[("on", "reverse")] == pytest.approx(1 / 200)
    rows = [{"task": "countdown-3", "policy": p, "kl": k, "lam": -1.0 if p == "off" else 1.0, "lr": 1e-4, "seed": 0,
             "accuracy": 0.4, "style_share": s} for (p, k), s in shares.items()]
    r = findings.finding_12(prepare_results(pd.DataFrame(rows)))
    assert r.part("a").verdict == findings.REPRODUCED and r.part("a").estimate.value == pytest.approx(1 / 200)
    assert r.part("b").estimate.value == 0.0 and r.part("b").verdict == findings.NOT_REPRODUCED
    assert "off+reverse 0.000" in r.detail
