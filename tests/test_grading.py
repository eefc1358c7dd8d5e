"""Tests for kdlab.tasks.grading: multiple-choice and maths-answer graders.

The dataset tests read the real MedQA / MATH-500 test files from ../shared/data (evaluation
only) and skip when they are absent.
"""
from __future__ import annotations

import json
import re
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from kdlab.tasks.grading import extract_choice, extract_math_answer, grade_choice, grade_math, math_equivalent

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA = REPO_ROOT.parent / "shared" / "data"


def _load_jsonl(name: str) -> list[dict]:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} is absent (the shared data directory ../shared/data is not mounted)")
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------------------------
# Multiple choice: unit tests
# --------------------------------------------------------------------------------------------

OPTS = {
    "A": "Disclose the error to the patient",
    "B": "B cells",
    "C": "Tell the attending",
    "D": "D-dimer",
    "E": "C. difficile colitis",
}


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("The answer is C.", "C"),
        ("Answer: (C)", "C"),
        ("**C**", "C"),
        ("So we pick $\\boxed{C}$.", "C"),
        ("\\boxed{\\text{C}}", "C"),
        ("C. Tell the attending", "C"),
        ("Some reasoning.\nMore reasoning.\nC", "C"),
        ("Some reasoning.\n(C)", "C"),
        ("tell the ATTENDING!", "C"),  # option text alone, case/punctuation-insensitive
        ("so the answer is (c)", "C"),
        ("the answer is c.", "C"),
        ("A is wrong because of X, B is wrong too... the answer is C", "C"),
        ("Answer: (A)\nOn reflection, the correct answer is **C**.", "C"),
        ("Therefore, C is the correct answer.", "C"),
        ("**Final answer:** C", "C"),
        ("The answer is therefore (E).", "E"),
        ("B cells", "B"),  # option text that starts with a letter-like word
        ("The answer is B cells, since ...", "B"),
        ("The answer is D-dimer.", "D"),  # "D-" is not the letter D
        ("C. difficile colitis", "E"),  # the text of option E, not letter C
        ("E. C. difficile colitis", "E"),
        ("The answer is B.\nExplanation: the answer is not A because ...", "B"),
    ],
)
def test_extract_choice_formats(completion: str, expected: str) -> None:
    assert extract_choice(completion, OPTS) == expected
    assert grade_choice(completion, OPTS, expected)
    for wrong in set(OPTS) - {expected}:
        assert not grade_choice(completion, OPTS, wrong)


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "I am not sure.",
        "It is either B or C.",
        "The answer is B or C.",
        "Answer: (A) and (C)",
        "The answer is F.",  # not a key of options
        "The answer is a beta blocker.",  # lower-case article, not a letter
        "A. first consider the anatomy",  # "A." followed by text that is not option A's
    ],
)
def test_extract_choice_ambiguous_or_missing(completion: str) -> None:
    assert extract_choice(completion, OPTS) is None
    assert not any(grade_choice(completion, OPTS, k) for k in OPTS)


def test_grade_choice_only_keys_are_letters() -> None:
    opts = {"A": "alpha", "B": "beta"}
    assert not grade_choice("The answer is C.", opts, "A")
    assert grade_choice("The answer is B.", opts, "B")


def test_grade_choice_bad_input() -> None:
    with pytest.raises(ValueError, match="answer_idx"):
        grade_choice("The answer is A", OPTS, "Z")
    with pytest.raises(ValueError, match="options"):
        grade_choice("The answer is A", {}, "A")
    with pytest.raises(ValueError, match="completion"):
        grade_choice(None, OPTS, "A")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Multiple choice: MedQA
# --------------------------------------------------------------------------------------------


def test_medqa_reference_formats_grade_correct_and_wrong_letters_grade_wrong() -> None:
    rows = _load_jsonl("medqa_test.jsonl")
    failures: list[str] = []
    checked = 0
    for n, row in enumerate(rows):
        options, answer_idx = row["options"], row["answer_idx"]
        assert options[answer_idx] == row["answer"]
        texts = [" ".join(t.lower().split()) for t in options.values()]
        text_format_ok = len(set(texts)) == len(texts)  # identical texts cannot be told apart
        for letter, text in options.items():
            formats = {
                "answer-is": f"The answer is {letter}.",
                "answer-colon": f"Answer: ({letter})",
                "boxed": f"\\boxed{{{letter}}}",
                "letter-text": f"{letter}. {text}",
            }
            if text_format_ok:
                formats["text"] = text
            for name, completion in formats.items():
                got = grade_choice(completion, options, answer_idx)
                checked += 1
                if got != (letter == answer_idx):
                    failures.append(f"row {n} {name} {completion!r} (answer {answer_idx}): {got}")
    assert checked > 25 * len(rows) * 0.9
    assert not failures, f"{len(failures)} of {checked} misgraded: {failures[:20]}"


# --------------------------------------------------------------------------------------------
# Maths: unit tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b",
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\frac{1}{2}", "1/2"),
        ("\\frac{1}{2}", "\\dfrac12"),
        ("\\frac12", "0.5"),
        ("\\tfrac{1}{2}", ".5"),
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("2 \\sqrt 3", "\\sqrt{12}"),
        ("\\sqrt[3]{8}", "2"),
        ("\\pi/2", "\\frac{\\pi}{2}"),
        ("10\\%", "10"),
        ("1,000", "1000"),
        ("10,\\!080", "10080"),
        ("\\$32,\\!348", "32348"),
        ("x=5", "5"),
        ("x = 5", "5"),
        ("\\text{(B)}", "B"),
        ("\\text{(B)}", "(B)"),
        ("(3, -1)", "(3,-1)"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
        ("[2,5)", "[2, 5)"),
        ("(-\\infty, 0]", "(-\\infty,0]"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
        ("864 \\mbox{ inches}^2", "864"),
        ("5.4 \\text{ cents}", "5.4"),
        ("2\\cdot 3", "6"),
        ("2\\times 3", "6"),
        ("1\\frac{4}{5}", "1.8"),  # mixed number
        ("6 - 5i", "-5i+6"),
        ("2k+2", "2(k+1)"),
        ("\\frac{\\cos x}{\\sin x}", "\\cot x"),
        ("-2,1", "1, -2"),  # solution lists are unordered
        ("1 \\pm \\sqrt{19}", "1-\\sqrt{19}, 1+\\sqrt{19}"),
        ("\\{1\\pm\\sqrt{5},-2\\}", "\\{-2, 1+\\sqrt5, 1-\\sqrt5\\}"),
        ("(0,9) \\cup (9,36)", "(0, 9)\\cup(9, 36)"),
        ("x \\in [-2,7]", "[-2,7]"),
        ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}",
         "\\begin{pmatrix} -\\frac13 \\\\ \\frac{2}{3} \\end{pmatrix}"),
        ("5x - 7y + 11z + 4 = 0", "-10x + 14y - 22z - 8 = 0"),
        ("y = 2x + 3", "3 + 2x"),
        ("\\text{Evelyn}", "Evelyn"),
        ("4210_{5}", "4210_5"),
        ("5!", "120"),
    ],
)
def test_math_equivalent_pairs(a: str, b: str) -> None:
    assert math_equivalent(a, b)
    assert math_equivalent(b, a)


@pytest.mark.parametrize(
    "a, b",
    [
        ("3.14", "\\pi"),
        ("0.333", "\\frac13"),
        ("(3,-1)", "(-1,3)"),  # tuples are ordered
        ("[2,5)", "[2,5]"),  # interval ends matter
        ("(2,5)", "2,5"),
        ("x^3+3x-5", "x^3+3x-6"),
        ("p - q", "q - p"),
        ("52_8", "52"),
        ("\\text{east}", "\\text{seat}"),  # words are not products of letters
        ("1,000", "1,001"),
        ("11111111100", "11111111101"),  # exact comparison for rationals
        ("5x - 7y + 11z + 4 = 0", "5x - 7y + 11z + 5 = 0"),
        ("-2,1", "1,2"),
        ("\\frac{1}{2}", ""),
    ],
)
def test_math_not_equivalent_pairs(a: str, b: str) -> None:
    assert not math_equivalent(a, b)
    assert not math_equivalent(b, a)


def test_math_verify_normalisation() -> None:
    # math-verify's normaliser, reached through math_equivalent: dollars and a trailing period,
    # \\dfrac with bare digits, \\left/\\right, thin spaces in thousands, \\text around a letter
    assert math_equivalent("$\\dfrac12$.", "\\frac{1}{2}")
    assert math_equivalent("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})")
    assert math_equivalent("11,\\! 111,\\! 111,\\! 100", "11111111100")
    assert not math_equivalent("11,\\! 111,\\! 111,\\! 100", "11111111101")
    assert math_equivalent("\\text{(C)}", "C")
    assert math_equivalent("\\cot x", "\\frac{\\cos x}{\\sin x}")


def test_extract_math_answer() -> None:
    assert extract_math_answer("so $\\boxed{\\frac{1}{\\sqrt{2}}}$.") == "\\frac{1}{\\sqrt{2}}"
    assert extract_math_answer("first \\boxed{3}, then \\boxed{4}") == "4"
    assert extract_math_answer("\\fbox{7}") == "7"
    assert extract_math_answer("\\boxed 5") == "5"
    assert extract_math_answer("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    minerva = "The final answer is $\\frac{1}{2}$. I hope it is correct."
    assert extract_math_answer(minerva) == "\\frac{1}{2}"
    assert extract_math_answer("Answer: 3.5\n") == "3.5"
    assert extract_math_answer("The answer is 12. Done.") == "12"
    assert extract_math_answer("I computed 12.") is None
    assert extract_math_answer("\\boxed{5") is None


def test_grade_math_extraction_and_equivalence() -> None:
    assert grade_math("Hence $\\boxed{\\frac{1}{\\sqrt{2}}}$.", "\\frac{\\sqrt2}{2}")
    assert grade_math("first \\boxed{3}, then \\boxed{4}", "4")
    assert not grade_math("first \\boxed{3}, then \\boxed{4}", "3")
    assert grade_math("The answer is $x=5$.", "5")
    assert grade_math("Answer: 1,000", "1000")
    assert not grade_math("I computed 12.", "12")  # nothing extractable
    assert not grade_math("", "12")
    assert not grade_math("\\boxed{5", "5")


def test_grade_math_guards_against_huge_expressions() -> None:
    start = time.perf_counter()
    assert not grade_math("\\boxed{2^{2^{2^{100}}}}", "5")
    assert not grade_math("\\boxed{10^{100000000}}", "10")
    assert not grade_math("\\boxed{100000!}", "1")
    assert not grade_math("\\boxed{" + "(" * 500 + "1" + ")" * 500 + "}", "2")
    assert time.perf_counter() - start < 5.0


def test_graders_stay_fast_on_degenerate_repetition() -> None:
    # small models often loop until the token budget; the graders must stay ~linear
    start = time.perf_counter()
    assert extract_choice("the answer is " * 5000, OPTS) is None
    assert extract_choice("**C** " * 5000, OPTS) == "C"
    assert not grade_math("\\boxed{" * 5000, "1")
    assert not grade_math("The answer is (" * 5000, "1")
    assert not grade_math("\\boxed{((((2^{1000})^{1000})^{1000})^{1000})}", "1")
    assert time.perf_counter() - start < 3.0


def test_grade_math_works_off_the_main_thread() -> None:
    results: list[bool] = []
    worker = threading.Thread(
        target=lambda: results.extend([grade_math("\\boxed{0.5}", "\\frac12"),
                                       grade_math("\\boxed{0.6}", "\\frac12")])
    )
    worker.start()
    worker.join(timeout=30)
    assert results == [True, False]


def test_grade_math_bad_input() -> None:
    with pytest.raises(ValueError, match="answer"):
        grade_math("\\boxed{1}", "  ")
    with pytest.raises(ValueError, match="completion"):
        grade_math(None, "1")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Maths: MATH-500
# --------------------------------------------------------------------------------------------


def test_math500_reference_answers_grade_correct() -> None:
    rows = _load_jsonl("math500_test.jsonl")
    formats = {
        "boxed": "We simplify and obtain $\\boxed{{{}}}$.",
        "answer-is": "After simplifying, the answer is ${}$.",
    }
    report = {}
    for name, template in formats.items():
        fails = [a for a in (r["answer"] for r in rows) if not grade_math(template.format(a), a)]
        report[name] = (1 - len(fails) / len(rows), fails)
    print({name: f"{rate:.1%}" for name, (rate, _) in report.items()})
    for name, (rate, fails) in report.items():
        assert rate == 1.0, f"{name}: pass rate {rate:.1%}, failing answers {fails[:20]}"


def _rewrite(answer: str) -> str:
    """Same value, different spelling: digit fractions as (a/b), no \\left/\\right or thin
    spaces, a space after each comma, degrees as a unicode sign."""
    s = re.sub(r"(?<![\d}\s])\\[dt]?frac\{(\d+)\}\{(\d+)\}", r"(\1/\2)", answer)
    s = re.sub(r"\\left|\\right|\\!|\\,", "", s)
    s = re.sub(r",\s*", ", ", s)
    return s.replace("^\\circ", "°")


def test_math500_rewritten_reference_answers_grade_correct() -> None:
    rows = _load_jsonl("math500_test.jsonl")
    pairs = [(_rewrite(r["answer"]), r["answer"]) for r in rows]
    changed = [(w, a) for w, a in pairs if w != a]
    assert len(changed) > 50
    fails = [(w, a) for w, a in changed if not grade_math(f"Thus $\\boxed{{{w}}}$", a)]
    assert not fails, f"{len(fails)} of {len(changed)} rewritten answers rejected: {fails[:20]}"


def _perturb_first_number(answer: str) -> str | None:
    """Append "1" to the first digit run that is not an exponent, a base subscript or a
    ``\\frac43``-style shorthand argument (where "\\frac431" still means 4/3 * 1)."""
    for m in re.finditer(r"\d+", answer):
        before = answer[: m.start()].rstrip("{")
        if before.endswith(("^", "_")) or re.search(r"\\[dt]?frac\s*$", answer[: m.start()]):
            continue
        return answer[: m.end()] + "1" + answer[m.end() :]
    return None


def _value_key(answer: str) -> str:
    """Independent (grader-free) key: equal keys mean "same value" for simple answers."""
    s = re.sub(r"\\left|\\right|\\!|\\,|\$|\s", "", answer)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\^\{?\\circ\}?", "", s)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"^[a-z]=", "", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{(\d+)\}(\d)", r"\\frac{\1}{\2}", s)
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", s)
    if m:
        return str(Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1))
    if re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", s):
        return str(Fraction(s))
    return s


def test_math500_wrong_answers_grade_wrong() -> None:
    rows = _load_jsonl("math500_test.jsonl")
    answers = [r["answer"] for r in rows]
    negatives: list[tuple[str, str]] = []  # (wrong answer, reference)
    for i, ref in enumerate(answers):
        perturbed = _perturb_first_number(ref)
        if perturbed is not None:
            negatives.append((perturbed, ref))
        for step in range(1, len(answers)):
            other = answers[(i + step) % len(answers)]
            if _value_key(other) != _value_key(ref):
                negatives.append((other, ref))
                break
    assert len(negatives) > 900
    accepted = [(w, r) for w, r in negatives if grade_math(f"So $\\boxed{{{w}}}$.", r)]
    rate = 1 - len(accepted) / len(negatives)
    print(f"MATH-500 negatives graded wrong: {rate:.2%} of {len(negatives)}")
    assert rate >= 0.99, f"{len(accepted)} wrong answers accepted: {accepted}"


def test_grade_math_decides_with_math_verify_quietly(caplog) -> None:
    import logging

    from kdlab.tasks import grading

    assert grading._math_verify().__name__ == "math_verify"
    with caplog.at_level(logging.DEBUG):
        assert grade_math("so $\\boxed{\\frac{\\sqrt{2}}{2}}$", "\\frac{1}{\\sqrt2}")
        assert not grade_math("so $\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{1}{\\sqrt2}")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "math-verify logged warnings"
