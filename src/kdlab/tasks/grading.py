"""Rule-based graders for real-dataset completions (no model-based judging).

Two graders:

- ``grade_choice`` maps a free-text completion for a multiple-choice question (MedQA-style,
  options keyed by letters) to one option letter and compares it with the reference letter.
- ``grade_math`` extracts the final answer of a maths completion (last ``\\boxed{...}``, else a
  final "answer is X") and decides whether it is equivalent to a LaTeX reference answer:
  string normalisation first (units, thousands separators, ``\\dfrac``, ``x=``, ...), then
  Hugging Face's ``math-verify`` (the grader of lighteval, TRL and open-r1) on the raw and the
  normalised answers. Numerals in another base and word answers compare as strings only; a
  bare list never equals a tuple or an interval.

Both graders return ``False`` whenever nothing can be extracted or a step fails; math-verify
runs under a wall-clock guard (SIGALRM, main thread only) plus static limits on expression
size, big exponents and factorials, so a hostile completion cannot hang an evaluation loop.
"""
from __future__ import annotations

import logging
import re
import signal
import threading
import unicodedata
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator

__all__ = [
    "extract_choice",
    "grade_choice",
    "extract_math_answer",
    "normalise_math_answer",
    "math_equivalent",
    "grade_math",
]

# --------------------------------------------------------------------------------------------
# Multiple choice
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


def _read_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the brace group opening at ``text[start] == '{'`` and the index after it.

    Escaped braces (``\\{``, ``\\}``) do not count. None when the group is not closed.
    """
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each '{' -> index of its matching '}' (escaped braces ignored), in one pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _boxed_spans(text: str) -> list[tuple[int, str]]:
    """(position, content) of every brace-balanced ``\\boxed{...}``/``\\fbox{...}`` (or
    ``\\boxed x``), in order. Linear in the text length (degenerate repetitions stay cheap)."""
    out = []
    pairs: dict[int, int] | None = None
    for m in _BOXED_RE.finditer(text):
        j = m.end()
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            if pairs is None:
                pairs = _brace_pairs(text)
            close = pairs.get(j)
            if close is not None:
                out.append((m.start(), text[j + 1 : close]))
        elif j > m.end():
            tok = re.match(r"[^\s$]+", text[j:])
            if tok:
                out.append((m.start(), tok.group(0)))
    return out


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
    for pos, content in _boxed_spans(completion):
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
# Maths: extraction
# --------------------------------------------------------------------------------------------

_MATH_CUE_RE = re.compile(r"answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)


def _math_segment(text: str) -> str:
    """First ``$...$``/``$$...$$``/``\\(...\\)`` segment at the start of ``text``, else the text
    up to the first sentence-ending period (a '.' followed by whitespace or the end)."""
    text = text.strip()
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(open_):
            i = len(open_)
            while i < len(text):
                if text.startswith(close, i):
                    return text[len(open_) : i]
                i += 2 if text[i] == "\\" else 1  # skip escapes such as \$
            return text[len(open_) :]
    m = re.search(r"\.(?=\s|$)", text)
    return text[: m.start()] if m else text


def extract_math_answer(completion: str) -> str | None:
    """The final answer of a maths completion as raw LaTeX, or None.

    The last brace-balanced ``\\boxed{...}``/``\\fbox{...}`` wins; failing that, what follows
    the last "answer is"/"Answer:" on its line (a leading ``$...$`` segment, or the text up to
    the end of the sentence).
    """
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {completion!r}")
    boxed = _boxed_spans(completion)
    if boxed:
        content = boxed[-1][1].strip()
        return content or None
    matches = list(_MATH_CUE_RE.finditer(completion))
    if not matches:
        return None
    start = matches[-1].end()
    end = completion.find("\n", start)
    segment = _math_segment(completion[start : end if end >= 0 else len(completion)]).strip()
    return segment or None


# --------------------------------------------------------------------------------------------
# Maths: string normalisation
# --------------------------------------------------------------------------------------------

_UNIT_WORDS = (
    "degrees|degree|cm|centimeters|centimetres|meters|metres|km|mm|inches|inch|feet|"
    "foot|ft|yards|yd|miles|units|unit|sq|square|cents|cent|dollars|dollar|hours|hour|hrs|"
    "minutes|minute|min|seconds|second|sec|days|day|weeks|years|mph|pounds|lbs|ounces|oz|"
    "grams|kg|liters|litres|ml|people|students|ways|points|percent"
)
_TRAILING_UNIT_RE = re.compile(r"(?<=\S)\s*\\text\{[^{}]*\}(?:\^\{?\d\}?)?\s*$")
_PLAIN_UNIT_RE = re.compile(
    r"^([-+0-9.,/\s]*[0-9])\s*(?:" + _UNIT_WORDS + r")(?:\^\{?\d\}?)?\.?$", re.IGNORECASE
)
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _brace_command_args(s: str) -> str:
    """Rewrite ``\\frac12``, ``\\frac 59``, ``\\frac9{19}``, ``\\sqrt2`` with braced arguments."""
    out: list[str] = []
    i = 0
    cmd_re = re.compile(r"\\(frac|sqrt)(?![a-zA-Z])")
    while i < len(s):
        m = cmd_re.match(s, i)
        if not m:
            if s[i] == "\\" and i + 1 < len(s):  # keep escapes like \\ or \{ intact
                out.append(s[i : i + 2])
                i += 2
            else:
                out.append(s[i])
                i += 1
            continue
        name = m.group(1)
        out.append("\\" + name)
        j = m.end()
        if name == "sqrt":
            k = j
            while k < len(s) and s[k] == " ":
                k += 1
            if k < len(s) and s[k] == "[":
                close = s.find("]", k)
                if close < 0:
                    out.append(s[j:])
                    return "".join(out)
                out.append(s[k : close + 1])
                j = close + 1
        for _ in range(2 if name == "frac" else 1):
            while j < len(s) and s[j] == " ":
                j += 1
            if j >= len(s):
                break
            if s[j] == "{":
                group = _read_group(s, j)
                if group is None:
                    break
                out.append("{" + _brace_command_args(group[0]) + "}")
                j = group[1]
            elif s[j] == "\\":
                cm = re.match(r"\\[a-zA-Z]+", s[j:])
                if not cm:
                    break
                out.append("{" + cm.group(0) + "}")
                j += cm.end()
            else:
                out.append("{" + s[j] + "}")
                j += 1
        i = j
    return "".join(out)


def _unwrap_command(s: str, name: str) -> str:
    """Replace every ``\\name{X}`` by ``X`` (brace-balanced)."""
    pattern = re.compile(r"\\" + name + r"\s*(?=\{)")
    while True:
        m = pattern.search(s)
        if not m:
            return s
        group = _read_group(s, m.end())
        if group is None:
            return s[: m.start()] + s[m.end() :]
        s = s[: m.start()] + group[0] + s[group[1] :]


def normalise_math_answer(answer: str) -> str:
    """Canonical string form of a LaTeX answer (the string half of ``math_equivalent``).

    Strips ``$``, ``\\left``/``\\right``, thin spaces, degrees, ``\\%``, ``\\$``, trailing unit
    ``\\text{...}``, trailing '.', whitespace and a leading ``x=``/``x \\in`` assignment;
    ``\\dfrac``/``\\tfrac`` -> ``\\frac`` with braced arguments; ``1,000`` -> ``1000``;
    ``(B)`` -> ``B``; word answers are lower-cased.
    """
    s = answer.strip()
    boxed = _boxed_spans(s)
    if boxed:
        s = boxed[-1][1].strip()
    s = unicodedata.normalize("NFKC", s)
    for a, b in (("−", "-"), ("×", "\\times "), ("·", "\\cdot "), ("π", "\\pi "),
                 ("°", "^\\circ"), ("∞", "\\infty "), ("≤", "\\le "), ("≥", "\\ge ")):
        s = s.replace(a, b)
    s = re.sub(r"^\\\[|\\\]$", "", s.strip())
    s = s.replace("\\$", "").replace("$", "")
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])\.?", "", s)
    s = re.sub(r"\\(?:displaystyle|quad|qquad)(?![a-zA-Z])", " ", s)
    # thin spaces (\! \, \; \: \ ) become spaces; matrix row breaks (\\) are kept
    s = re.sub(r"\\\\|\\[!,;: ]", lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s)
    s = s.replace("~", " ")
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(
        r"\\(?:mbox|textrm|textnormal|textbf|textit|textup|mathrm|mathbf|mathit)(?![a-zA-Z])",
        r"\\text",
        s,
    )
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ(?![a-zA-Z])|\\degree(?![a-zA-Z])", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip()
    while True:
        stripped = _TRAILING_UNIT_RE.sub("", s).strip()
        if stripped == s:
            break
        s = stripped
    s = _unwrap_command(s, "text")
    s = s.strip().rstrip(".").strip()
    m = _PLAIN_UNIT_RE.match(s)
    if m:
        s = m.group(1)
    s = _brace_command_args(s)
    # keep one space between a command and a following letter ("\cot x"), drop all others
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\x00", s)
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    s = re.sub(r"([_^])\{(\w)\}", r"\1\2", s)
    s = re.sub(r"_\{(\w+)\}", r"_\1", s)
    s = _strip_assignment(s)
    m = re.fullmatch(r"\(([A-Za-z])\)", s)
    if m:
        s = m.group(1)
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    if re.fullmatch(r"[A-Za-z]{3,}", s):
        s = s.lower()
    return s.rstrip(".")


def _strip_assignment(s: str) -> str:
    """``x=5`` -> ``5``, ``x\\in[-2,7]`` -> ``[-2,7]`` (only a single variable on the left)."""
    m = re.match(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\w+)?(?:=|\\in(?![a-zA-Z]))", s)
    if m and s.count("=") <= 1 and not s.startswith(("\\frac", "\\sqrt", "\\pi", "\\infty")):
        rest = s[m.end():]
        if rest:
            return rest
    return s


# --------------------------------------------------------------------------------------------
# Maths: equivalence (math-verify), under a wall-clock guard and static size limits
# --------------------------------------------------------------------------------------------

class _Timeout(BaseException):
    """Raised by the SIGALRM guard; a BaseException so library code cannot swallow it."""


_MAX_ANSWER_CHARS = 2000  # longest raw answer compared at all (real answers are far shorter)
_MAX_PARSED_CHARS = 300  # longest normalised answer handed to math-verify / sympy
_MAX_EXPONENT = 1000  # largest literal exponent or factorial argument
_MAX_NESTING = 30  # deepest bracket nesting
_EXPONENT_RE = re.compile(r"\^\s*(?:\{\s*(\d+)\s*\}|(\d+))")
_FACTORIAL_RE = re.compile(r"(\d+)\s*!")


def _too_big(s: str) -> bool:
    """True for answers sympy could hang on: long, deeply nested, power towers, exponents or
    factorial arguments above ``_MAX_EXPONENT`` (also as a product of stacked exponents)."""
    if len(s) > _MAX_PARSED_CHARS:
        return True
    depth = deepest = 0
    for c in s:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth -= 1
    if deepest > _MAX_NESTING:
        return True
    for m in re.finditer(r"\^\s*\{", s):  # a braced exponent holding another power: a tower
        group = _read_group(s, s.index("{", m.start()))
        if group is None or "^" in group[0] or "!" in group[0]:
            return True
    total = 1
    for m in _EXPONENT_RE.finditer(s):
        e = int(m.group(1) or m.group(2))
        if e > _MAX_EXPONENT:
            return True
        total *= max(e, 1)
    if total > 20 * _MAX_EXPONENT:
        return True
    if "!" in s and any(int(m.group(1)) > _MAX_EXPONENT for m in _FACTORIAL_RE.finditer(s)):
        return True
    return bool(re.search(r"\)\s*!|!\s*!", s))  # factorial of an expression, double factorial


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise _Timeout after ``seconds`` of wall time (main thread only; otherwise a no-op, and
    also a no-op when an interval timer is already running, e.g. an outer guard)."""
    usable = (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )
    if not usable:
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _QuietTimeouts(logging.Filter):
    """math-verify logs a warning on every call without its own timeout; ours is _time_limit."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@lru_cache(maxsize=1)
def _math_verify() -> Any:
    import math_verify  # imported on first use: it pulls in sympy and the ANTLR LaTeX parser

    for name in ("math_verify.grader", "math_verify.parser"):
        logging.getLogger(name).addFilter(_QuietTimeouts())
    return math_verify


def _parse(latex: str) -> list[Any]:
    mv = _math_verify()
    config = [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()]
    return mv.parse("$" + latex + "$", extraction_config=config, parsing_timeout=None)


def _kind(parsed: list[Any]) -> str:
    """'set' (a bare list or ``\\{...\\}``), 'ordered' (tuple, interval) or 'other'."""
    sp = _sympy()
    if not parsed or isinstance(parsed[0], str):
        return "other"
    x = parsed[0]
    if isinstance(x, sp.FiniteSet):
        return "set"
    if isinstance(x, (sp.Tuple, sp.Interval, sp.Union)):
        return "ordered"
    return "other"


@lru_cache(maxsize=1)
def _sympy() -> Any:
    import sympy

    return sympy


def _verify(prediction: str, reference: str) -> bool:
    """math-verify's decision (reference as gold); a bare list never equals a tuple or interval."""
    gold, pred = _parse(reference), _parse(prediction)
    if not gold or not pred:
        return False
    kinds = {_kind(gold), _kind(pred)}
    if kinds == {"set", "ordered"}:
        return False
    return bool(_math_verify().verify(gold, pred, float_rounding=12, timeout_seconds=None))


_BASE_RE = re.compile(r"[0-9A-Za-z]_\{?\d")  # 4210_5: a numeral in another base
_WORD_RE = re.compile(r"[A-Za-z]{3,}")  # a word answer ("east"), not a product of letters


def math_equivalent(prediction: str, reference: str, time_limit_s: float = 5.0) -> bool:
    """True when two LaTeX answers are equal after normalisation (``normalise_math_answer``) or
    mathematically equivalent according to ``math-verify`` (Hugging Face's grader, as used by
    lighteval, TRL and open-r1), tried on the raw and on the normalised answers.

    Numerals in another base (``52_8``) and words (``east``) must match as strings; a bare list (``2,5``) never
    equals a tuple or interval (``(2,5)``). ``time_limit_s`` bounds the work (seconds of wall
    time; enforced with SIGALRM in the main thread; elsewhere only the static size limits
    apply). Answers longer than 2000 characters, normalised answers sympy could hang on
    (``_too_big``), any parsing failure and a timeout all give False.
    """
    for name, value in (("prediction", prediction), ("reference", reference)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a str, got {value!r}")
    if len(prediction) > _MAX_ANSWER_CHARS or len(reference) > _MAX_ANSWER_CHARS:
        return False
    try:
        with _time_limit(time_limit_s):
            a, b = normalise_math_answer(prediction), normalise_math_answer(reference)
            if not a or not b:
                return False
            if a == b:
                return True
            if _BASE_RE.search(a) or _BASE_RE.search(b) or _WORD_RE.fullmatch(a) or _WORD_RE.fullmatch(b):
                return False  # numerals in another base and words compare as strings only
            if _too_big(a) or _too_big(b):
                return False
            if _too_big(prediction.strip()) or _too_big(reference.strip()):
                return _verify(a, b)
            return _verify(prediction, reference) or _verify(a, b)
    except _Timeout:
        return False
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
