"""Rule-based graders for real-dataset completions (no model-based judging).

Two graders:

- ``grade_choice`` maps a free-text completion for a multiple-choice question (MedQA-style,
  options keyed by letters) to one option letter and compares it with the reference letter.
- ``grade_math`` extracts the final answer of a maths completion and decides whether it is
  equivalent to a LaTeX reference answer, with Hugging Face's ``math-verify`` (the grader of
  lighteval, TRL and open-r1): its extraction (``parse`` with ``LatexExtractionConfig`` /
  ``ExprExtractionConfig``), its LaTeX normalisation (inside ``parse``), its comparison
  (``verify``) and its timeouts (``parsing_timeout`` / ``timeout_seconds``).

What is written here is only what math-verify does not do, each with its reason where it is
used: the multiple-choice extractor (math-verify's ``StringExtractionConfig`` finds a bare
letter but cannot match an option's text, flag "B or C", or read "(C)" or ``\\boxed{C}``);
the last ``\\boxed{}`` wins (math-verify reads nearby boxes as one set); a bare list never equals
a tuple or an interval, and numerals in another base compare as strings (math-verify reads
``52_8`` as 52); static size limits (a signal cannot stop one long big-integer operation, and
math-verify has no timeout off the main thread).

Both graders return ``False`` whenever nothing can be extracted or a step fails.
"""
from __future__ import annotations

import logging
import re
import threading
import unicodedata
from functools import lru_cache
from typing import Any

__all__ = [
    "extract_choice",
    "grade_choice",
    "extract_math_answer",
    "math_equivalent",
    "grade_math",
]

# --------------------------------------------------------------------------------------------
# Boxed answers
# --------------------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


def _box_content(segment: str) -> str | None:
    """Content of the ``\\boxed{...}`` / ``\\fbox{...}`` (or ``\\boxed x``) that ``segment`` starts
    with; None when its brace never closes.

    The brace matching is latex2sympy2's (math-verify's normaliser), ``extract_boxed_content``,
    which returns the rest of the text unchanged when the brace does not close. An unbraced
    argument (``\\boxed 5``) is read up to the next space or ``$`` here: the library would take
    the rest of the text."""
    from latex2sympy2_extended.math_normalization import extract_boxed_content

    rest = segment[_BOX_RE.match(segment).end():].lstrip()
    if rest.startswith("{"):
        content = extract_boxed_content(segment, mode="last")
        return None if content == rest else content
    token = re.match(r"[^\s$]+", rest)
    return token.group(0) if token else None


def _boxes(text: str) -> list[tuple[int, str]]:
    """(position, content) of every closed box of ``text``, in order. Each box is read from its
    own segment (up to the next box), so the work stays linear in the text length."""
    starts = [m.start() for m in _BOX_RE.finditer(text)]
    out = []
    for pos, end in zip(starts, starts[1:] + [len(text)]):
        content = _box_content(text[pos:end])
        if content is not None:
            out.append((pos, content))
    return out


# --------------------------------------------------------------------------------------------
# Multiple choice. Kept by hand: math-verify's StringExtractionConfig takes the last bare letter
# after "answer" (so "the answer is not A" gives A), cannot read "(C)", "(c)" or \boxed{C}, cannot
# match an option's text ("D-dimer", "C. difficile colitis" is option E) and has no notion of an
# ambiguous "B or C"; on the MedQA formats of tests/test_grading.py it misgrades 13 of 30 cases.
# --------------------------------------------------------------------------------------------

_AMBIGUOUS = "?"  # an explicit statement naming several letters

# "answer is", "final answer:", "the correct option is", "answer choice would be", ...
_CUE_RE = re.compile(
    r"(?:\banswer(?:\s+(?:choice|option))?|\b(?:correct|right|best)\s+(?:option|choice|response))"
    r"\s*(?:\*\*|__)?\s*"
    r"(?:is|would\s+be|should\s+be|must\s+be|will\s+be|:|=|-)"
    r"\s*(?:\*\*|__)?\s*:?"
    r"(?:\s*(?:therefore|thus|clearly|likely|probably|most\s+likely|definitely)\b)?",
    re.IGNORECASE,
)
# "C is the correct answer", "Option (C) is correct"
_LETTER_FIRST_RE = re.compile(
    r"(?:\b(?:option|choice)\s+)?\(?\b([A-Za-z])\b\)?\s+is\s+(?:the\s+)?"
    r"(?:correct|right|best|most\s+likely)(?:\s+(?:answer|option|choice))?\b",
)
_BOLD_RE = re.compile(r"\*\*\s*(\(?)\s*([A-Za-z])\s*(\)?)\s*[.:]?\s*\*\*")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_WRAPPER_RE = re.compile(r"\\(?:boxed|fbox|text|textbf|textrm|mathrm|mathbf|mbox)\s*\{")
_LEAD_JUNK = " \t\r\n*_$:`>#"
_TRAIL_JUNK = " \t\r\n*_$.`!"
_ALT_RE = re.compile(r"^\s*(?:or|and|/|,|&)\s*[\(\[]?\s*[A-Za-z]\s*[\)\]]?(?![A-Za-z])")
_LINE_LETTER_RE = re.compile(r"^[\(\[]?\s*([A-Za-z])\s*[\)\]]?\s*[.:]?$")
_LINE_LETTER_TEXT_RE = re.compile(r"^[\(\[]?([A-Za-z])(?:[\)\]]\s*[.:]?|[.:])\s*(\S.*)$", re.DOTALL)


def _norm_text(text: str) -> str:
    """Case/whitespace/punctuation-insensitive form of an option text.

    Comparison symbols and other non-punctuation characters (``<``, ``>``, arrows, ``+``) are
    kept so that options such as "LOD < 3" and "LOD > 3" stay distinct.
    """
    text = unicodedata.normalize("NFKC", text).lower()
    text = re.sub(r"[\s.,;:!?'\"`()\[\]{}\-_/\\*]+", " ", text)
    return " ".join(text.split())


def _letter_map(options: dict[str, str]) -> dict[str, str]:
    """Upper-cased single-letter key -> original key."""
    return {k.upper(): k for k in options if len(k) == 1 and k.isalpha()}


def _text_matches(span_norm: str, norm_options: dict[str, str], prefix: bool) -> str | None:
    """Key whose normalised option text equals (or, with ``prefix``, starts) ``span_norm``.

    With ``prefix`` the longest matching option wins; a tie between different options with the
    same text is ambiguous and gives None.
    """
    if not span_norm:
        return None
    hits = [
        (len(t), k)
        for k, t in norm_options.items()
        if t and (span_norm == t or (prefix and span_norm.startswith(t + " ")))
    ]
    if not hits:
        return None
    best = max(n for n, _ in hits)
    keys = {k for n, k in hits if n == best}
    return keys.pop() if len(keys) == 1 else None


def _clean_span(span: str) -> str:
    span = _WRAPPER_RE.sub("", span).replace("}", " ")
    return span.strip(_LEAD_JUNK)


def _parse_span(span: str, letters: dict[str, str], norm_options: dict[str, str]) -> str | None:
    """Letter named at the start of ``span`` (the text right after an answer cue).

    Order: the whole span is one option's text; a "strong" letter (bracketed, or followed by
    punctuation or the end); the span starts with one option's text; an upper-case letter
    followed by a space. Returns the key, ``_AMBIGUOUS`` for "B or C", or None.
    """
    span = _clean_span(span)
    if not span:
        return None
    key = _text_matches(_norm_text(span.rstrip(_TRAIL_JUNK)), norm_options, prefix=False)
    if key is not None:
        return key
    m = re.match(r"(?:(?:option|choice)\s+)?([\(\[]?)\s*([A-Za-z])(?:\s*([\)\]]))?", span, re.I)
    weak = None
    if m:
        opened, letter, closed = m.group(1), m.group(2), m.group(3) or ""
        rest = span[m.end():]
        strong = False
        if opened:
            strong = bool(closed)
        elif closed or not rest or rest[0] in ".:,;*!$\n":
            strong = True
        elif rest[0] in " \t" and letter.isupper():
            weak = letter
        if (opened and not closed) or (rest and rest[0].isalnum() and not closed):
            strong, weak = False, None
        if strong or weak:
            if _ALT_RE.match(rest):
                return _AMBIGUOUS
        if strong:
            return letters.get(letter.upper())
    key = _text_matches(_norm_text(span), norm_options, prefix=True)
    if key is not None:
        return key
    if weak is not None:
        return letters.get(weak.upper())
    return None


def extract_choice(completion: str, options: dict[str, str]) -> str | None:
    """The option key a completion commits to, or None when nothing unambiguous is found.

    Explicit statements ("answer is (B)", "Answer: B", "**B**", "\\boxed{B}", "B is the correct
    answer") are collected with their positions and the last one wins. Without any, the whole
    completion may be one option's text (case/punctuation-insensitive), or the completion /
    its last line may be "B", "(B)", "B." or "B. <start of option B's text>".
    """
    _check_choice_inputs(completion, options, None)
    letters = _letter_map(options)
    norm_options = {k: _norm_text(v) for k, v in options.items()}
    # a span longer than every option text (plus slack) cannot change the parse; capping it
    # keeps degenerate repetitive completions linear
    span_cap = max(len(t) for t in options.values()) + 64
    found: list[tuple[int, str]] = []
    for m in _CUE_RE.finditer(completion):
        line_end = completion.find("\n", m.end(), m.end() + span_cap)
        span = completion[m.end() : line_end if line_end >= 0 else m.end() + span_cap]
        key = _parse_span(span, letters, norm_options)
        if key is not None:
            found.append((m.start(), key))
    for m in _LETTER_FIRST_RE.finditer(completion):
        key = letters.get(m.group(1).upper())
        if key is not None and (m.group(1).isupper() or m.group(0).startswith("(")):
            found.append((m.start(), key))
    for m in _BOLD_RE.finditer(completion):
        opened, letter, closed = m.groups()
        if bool(opened) != bool(closed) or not (letter.isupper() or opened):
            continue
        key = letters.get(letter.upper())
        if key is not None:
            found.append((m.start(), key))
    for pos, content in _boxes(completion):
        key = _parse_span(content, letters, norm_options)
        if key is not None:
            found.append((pos, key))
    if found:
        key = max(found, key=lambda pair: pair[0])[1]
        return None if key == _AMBIGUOUS else key

    key = _text_matches(_norm_text(completion), norm_options, prefix=False)
    if key is not None:
        return key
    lines = [ln.strip(_LEAD_JUNK + _TRAIL_JUNK.replace(".", "")) for ln in completion.splitlines()]
    lines = [ln for ln in lines if ln]
    candidates = [completion.strip(_LEAD_JUNK)] + lines[-1:]
    for cand in candidates:
        key = _text_matches(_norm_text(cand), norm_options, prefix=False)
        if key is not None:
            return key
        m = _LINE_LETTER_RE.match(cand)
        if m and (m.group(1).isupper() or cand.startswith(("(", "["))):
            key = letters.get(m.group(1).upper())
            if key is not None:
                return key
        m = _LINE_LETTER_TEXT_RE.match(cand)
        if m:
            key = letters.get(m.group(1).upper())
            if key is not None:
                given, own = _norm_text(m.group(2)), norm_options[key]
                consistent = given == own or given.startswith(own + " ") or own.startswith(given)
                if given and own and consistent:
                    return key
    return None


def _check_choice_inputs(completion: Any, options: Any, answer_idx: Any) -> None:
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {completion!r}")
    if not isinstance(options, dict) or not options:
        raise ValueError(f"options must be a non-empty dict of letter -> text, got {options!r}")
    for k, v in options.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"options must map str -> str, got entry {k!r}: {v!r}")
    if answer_idx is not None and answer_idx not in options:
        raise ValueError(
            f"answer_idx must be a key of options {sorted(options)}, got {answer_idx!r}"
        )


def grade_choice(completion: str, options: dict[str, str], answer_idx: str) -> bool:
    """True when the option the completion commits to (see ``extract_choice``) is ``answer_idx``.

    ``options`` maps letters (e.g. "A".."E") to option texts; only its keys are valid letters.
    Nothing extractable, or an ambiguous statement ("B or C"), grades False.
    """
    _check_choice_inputs(completion, options, answer_idx)
    return extract_choice(completion, options) == answer_idx


# --------------------------------------------------------------------------------------------
# Maths: math-verify's extraction, normalisation, comparison and timeouts
# --------------------------------------------------------------------------------------------

_MAX_ANSWER_CHARS = 2000  # longest raw answer compared at all (real answers are far shorter)
_MAX_PARSED_CHARS = 300  # longest answer handed to math-verify / sympy
_MAX_EXPONENT = 1000  # largest literal exponent or factorial argument
_MAX_NESTING = 30  # deepest bracket nesting
_EXPONENT_RE = re.compile(r"\^\s*(?:\{\s*(\d+)\s*\}|(\d+))")
_FACTORIAL_RE = re.compile(r"(\d+)\s*!")
_TOWER_RE = re.compile(r"\^\s*\{[^}]*[\^!]")  # a braced exponent holding another power or a factorial
_BASE_RE = re.compile(r"[0-9A-Za-z]_\{?\d")  # 4210_5: a numeral in another base
_GROUPED_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")  # 32,348: digits in groups of three


def _too_big(s: str) -> bool:
    """True for answers sympy could hang on: long, deeply nested, power towers, exponents or
    factorial arguments above ``_MAX_EXPONENT`` (also as a product of exponents stacked on
    brackets).

    Kept by hand: math-verify's timeouts are SIGALRM, which cannot interrupt one long C-level
    big-integer operation (``10^{100000000}``) and do not exist off the main thread."""
    if len(s) > _MAX_PARSED_CHARS:
        return True
    depth = deepest = 0
    for c in s:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth -= 1
    if deepest > _MAX_NESTING or _TOWER_RE.search(s):
        return True
    stacked = 1  # product of the exponents of bracketed powers: ((2^{9})^{9})^{9} is 2^{729}
    for m in _EXPONENT_RE.finditer(s):
        e = int(m.group(1) or m.group(2))
        if e > _MAX_EXPONENT:
            return True
        if s[:m.start()].rstrip().endswith((")", "}")):
            stacked *= max(e, 1)
    if stacked > 20 * _MAX_EXPONENT:
        return True
    if "!" in s and any(int(m.group(1)) > _MAX_EXPONENT for m in _FACTORIAL_RE.finditer(s)):
        return True
    return bool(re.search(r"\)\s*!|!\s*!", s))  # factorial of an expression, double factorial


class _QuietTimeouts(logging.Filter):
    """math-verify warns once that its timeout is off; off the main thread that is deliberate
    (``_timeout``) and the static limits (``_too_big``) stand in."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@lru_cache(maxsize=1)
def _math_verify() -> Any:
    import math_verify  # imported on first use: it pulls in sympy and the ANTLR LaTeX parser

    for name in ("math_verify.grader", "math_verify.parser"):
        logging.getLogger(name).addFilter(_QuietTimeouts())
    return math_verify


def _timeout(seconds: float) -> int | None:
    """math-verify's timeout argument: whole seconds (it uses ``signal.alarm``) in the main
    thread, None elsewhere, where a signal cannot be set and math-verify would refuse to run."""
    main = threading.current_thread() is threading.main_thread()
    return max(1, round(seconds)) if main else None


def _extraction(anchored: bool) -> list[Any]:
    """math-verify's LaTeX and expression extraction. ``anchored``: only after an answer cue
    ("answer is", "Answer:", "final answer is ... I hope"), boxes being read by ``_boxes``."""
    mv = _math_verify()
    if anchored:
        return [mv.LatexExtractionConfig(try_extract_without_anchor=False, boxed_match_priority=-1),
                mv.ExprExtractionConfig(try_extract_without_anchor=False)]
    return [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()]


def extract_math_answer(completion: str, time_limit_s: float = 5.0) -> str | None:
    """The final answer of a maths completion as LaTeX, or None.

    The last brace-balanced ``\\boxed{...}``/``\\fbox{...}`` wins (math-verify would read boxes
    a few characters apart as one set: a completion that boxes a draft, then its answer, would
    be graded on both); failing that, math-verify's extraction after an answer cue, as the
    string it normalised.
    """
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {completion!r}")
    boxes = _boxes(completion)
    if boxes:
        return boxes[-1][1].strip() or None
    found = _math_verify().parse(completion, _extraction(anchored=True), parsing_timeout=_timeout(time_limit_s))
    text = next((x for x in reversed(found) if isinstance(x, str)), "").strip()
    return text or None


def _parse(latex: str, time_limit_s: float) -> list[Any]:
    return _math_verify().parse("$" + latex + "$", _extraction(anchored=False), parsing_timeout=_timeout(time_limit_s))


def _kind(parsed: list[Any]) -> str:
    """'set' (a bare list or ``\\{...\\}``), 'ordered' (tuple, interval) or 'other'."""
    import sympy

    x = parsed[0] if parsed else None
    if isinstance(x, sympy.FiniteSet):
        return "set"
    if isinstance(x, (sympy.Tuple, sympy.Interval, sympy.Union)):
        return "ordered"
    return "other"


def _numeral(s: str) -> str:
    """A numeral in another base as a plain string (``4210_{5}`` -> ``4210_5``)."""
    return re.sub(r"_\{(\w+)\}", r"_\1", re.sub(r"[\s$]", "", s))


def _ungrouped(s: str) -> str:
    """``10, 080`` / ``\\$32,\\!348`` -> ``10080`` / ``32348`` when the whole answer is one number in
    comma-separated groups of three (spaces allowed after the commas): math-verify reads
    ``10, 080`` as the list {10, 80}. Any other answer is returned unchanged."""
    compact = re.sub(r"\\[!,;: ]|\s|\\?\$", "", s)
    return compact.replace(",", "") if _GROUPED_RE.fullmatch(compact) else s


def math_equivalent(prediction: str, reference: str, time_limit_s: float = 5.0) -> bool:
    """True when math-verify finds two LaTeX answers equivalent (reference as gold), with three
    rules of its own: a bare list (``2,5``) never equals a tuple or an interval (``(2,5)``;
    math-verify compares a set with them element by element), numerals in another base
    (``52_8``) compare as strings (math-verify drops the subscript) and a number written in
    groups of three is one number (``_ungrouped``).

    ``time_limit_s`` is math-verify's timeout for each parse and comparison (whole seconds,
    main thread only). Answers longer than 2000 characters, answers sympy could hang on
    (``_too_big``), any parsing failure and a timeout all give False.
    """
    for name, value in (("prediction", prediction), ("reference", reference)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a str, got {value!r}")
    if len(prediction) > _MAX_ANSWER_CHARS or len(reference) > _MAX_ANSWER_CHARS:
        return False
    a, b = _ungrouped(prediction.strip()), _ungrouped(reference.strip())
    if not a or not b or _too_big(a) or _too_big(b):
        return False
    if _BASE_RE.search(a) or _BASE_RE.search(b):
        return _numeral(a) == _numeral(b)
    try:
        gold, pred = _parse(b, time_limit_s), _parse(a, time_limit_s)
        if not gold or not pred or {_kind(gold), _kind(pred)} == {"set", "ordered"}:
            return False
        return bool(_math_verify().verify(gold, pred, float_rounding=12, timeout_seconds=_timeout(time_limit_s)))
    except Exception:  # includes RecursionError on absurdly nested input
        return False


def grade_math(completion: str, answer: str) -> bool:
    """True when the completion's final answer (``extract_math_answer``) is equivalent to the
    reference LaTeX ``answer`` (``math_equivalent``); False when nothing is extractable."""
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {completion!r}")
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"answer must be a non-empty str, got {answer!r}")
    prediction = extract_math_answer(completion)
    if prediction is None:
        return False
    return math_equivalent(prediction, answer)
