"""Which part of a completion is its final answer: brorl's extraction policy for ``math_answer``.

Pure string work, no sympy: it runs in the service process for every path, so every scan here is
linear in the text (formulas found by one tokenizing pass, braces matched in one pass, no regex
that backtracks over the text). Order, first that applies:

1. the whole completion is a bare answer (``42``, ``\\frac{10}{9}``, ``x \\geq 5``, ``odd``);
2. whichever comes later of the last ``\\boxed{}``/``\\fbox{}`` group and the last answer marker
   ("the answer is", "Final Answer:", GSM8K's ``#### x``); boxes written side by side
   ("\\boxed{3}, \\boxed{4}") are one group and mean that set;
3. the last resort, whichever ends later: the last formula (``... so $$f(y) = y$$``), or the last
   number that is not inside a word (``AZYUK2A`` has none), where a run like "3 or 4" is that set.

Answers are compared in ``math_equal`` (docs/rewards.md says what is equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_SPAN_CHARS = 2000  # how far after an answer marker its answer may reach
_BARE_MAX_CHARS = 300
_MAX_MARKERS = 20  # markers tried from the end before giving up on markers

_BOX = re.compile(r"\\(?:boxed|fbox)\b\s*")
_BRACE = re.compile(r"[{}]")
_SOLUTION_MARK = re.compile(r"(?:^|\s)####[ \t]*[-+$\d.]", re.MULTILINE)
_BOX_SEPARATOR = re.compile(r",|;|\band\b|\bor\b")
_MARKER = re.compile(
    r"\bfinal\s+answer\b(?:\s*(?:is\b|:))?"
    r"|\banswers?\s*(?:is|are|(?:would|will|should)\s+be)\b\s*:?"
    r"|\banswers?\s*[:=]"
    r"|\banswer\s*(?=\$|\\\[|\\\(|\\boxed)"
    r"|(?:^|(?<=\s))####[ \t]*(?=[-+$\d.\\])",
    re.IGNORECASE | re.MULTILINE,
)
# Math delimiters; an escaped dollar (\$, a currency sign) is not one.
_DELIM = re.compile(r"(?<!\\)\$\$|\\\[|\\\]|\\\(|\\\)|(?<!\\)\$|\n")
_CLOSING = {"$$": "$$", "\\[": "\\]", "\\(": "\\)", "$": "$"}
_SENTENCE_END = re.compile(
    r"\.(?=\s|$)|[!?](?=\s|$)|\bI hope it is correct\b"
    r"|[,;]?\s+(?:because|since|which|where|so|thus|therefore|as)\b",
    re.IGNORECASE,
)
_COPULA = re.compile(r"\b(?:is|are|equals?|was|were)\b", re.IGNORECASE)
_JOINER = re.compile(r"(?:\s|,|;|\band\b|\bor\b|\\text\{\s*(?:and|or)\s*\}|\\q?quad\b)*")
_OR = re.compile(r"\bor\b", re.IGNORECASE)
_PERCENT_AFTER = re.compile(r"\s*(?:\\%|%|percent\b|percentage\b)", re.IGNORECASE)
_NUM = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:[.,]\d+)?(?:/\d+)?|\.\d+)"
_NUMBER = re.compile(r"(?<![\w.\\])[-+]?" + _NUM + r"(?!\d)")
_NUMBER_RUN = re.compile(
    r"(?<![\w.\\])[-+]?" + _NUM + r"(?:\s*(?:,|;|\bor\b|\band\b)\s*[-+]?" + _NUM + r")*(?!\d)"
)
_BARE_STOP = re.compile(r"[:#?!]|\.\.")  # prose punctuation: not a bare answer
_WORD = re.compile(r"(?<!\\)\b[A-Za-z]{2,}\b")
_PROSE_WORD = re.compile(r"(?<![\\_^A-Za-z])(?=[A-Za-z]*[a-z][A-Za-z]*[a-z])[A-Za-z]{4,}\b")
_TEXT_BRACES = re.compile(r"\\(?:text\w*|mbox|math\w+|operatorname)\s*\{[^{}]*\}")
_LEADING_NUMBER_WORDS = re.compile(r"[-+]?[$€£]?(?:\d[\d,./]*\d|\d)\s*%?\s+[A-Za-z]")
# A unit written against its number ("5km", "1,000.99m²") leaves the number readable; any other
# letter against it ("AZYUK2A", "3x") makes it part of a word or a term.
_GLUED_UNITS = frozenset(
    "m cm mm km g kg mg s ms h min hr l ml ft in lb lbs oz mph kph kmh st nd rd th".split()
)


@dataclass(frozen=True)
class Answer:
    """An extracted answer. ``math``: written in math mode (a formula, a box, LaTeX), which decides
    how it is parsed. ``ordered``: false when it was put together from separate answers (boxes,
    formulas, "3 or 4"), which are a set, never a list whose order counts."""

    text: str
    how: str  # bare | boxed | marker | formula | last_number | reference
    math: bool = True
    ordered: bool = True


def extract_answer(text: str, last_number: bool = True) -> Answer | None:
    """The final answer of ``text`` (a completion, or a solution used as a reference)."""
    stripped = text.strip()
    if not stripped:
        return None
    if _is_bare(stripped):
        return Answer(_clean_span(stripped), "bare", math=_looks_latex(stripped))
    boxed = _last_box_group(text)
    marker = _last_marker(text)
    if boxed is not None and (marker is None or boxed[0] >= marker[0]):
        return boxed[1]
    if marker is not None:
        return marker[1]
    formula = _last_formula(text)
    number = _last_number(text) if last_number else None
    if formula is not None and (number is None or formula[0] >= number[0]):
        return formula[1]
    return number[1] if number is not None else None


def read_reference(reference: str, kind: str, last_number: bool = True) -> Answer | None:
    """The reference's answer: the whole reference (``answer``), or extracted like a completion
    (``solution``: GSM8K's ``#### 42``, MATH's boxed solutions)."""
    if kind == "solution":
        return extract_answer(reference, last_number=last_number)
    stripped = reference.strip()
    if not stripped:
        return None
    boxed = _last_box_group(stripped)
    if boxed is not None and stripped.lstrip("$").startswith(("\\boxed", "\\fbox")):
        return boxed[1]
    inner = _whole_formula(stripped)
    if inner is not None:
        return Answer(_clean_span(inner), "reference")
    return Answer(_clean_span(stripped), "reference", math=_looks_latex(stripped))


def looks_like_solution(reference: str) -> bool:
    """A reference with a GSM8K ``#### x`` line or a box that is not all of it is a worked
    solution: read as an answer it would be text that no completion equals."""
    stripped = reference.strip()
    if _SOLUTION_MARK.search(stripped):
        return True
    box = _BOX.search(stripped)
    return box is not None and box.start() > 1


# ------------------------------------------------------------------------------------ boxes


def _brace_pairs(text: str, start: int) -> dict[int, int]:
    """Opening-brace index → its closing brace, for every brace from ``start`` (one pass)."""
    stack: list[int] = []
    pairs: dict[int, int] = {}
    for m in _BRACE.finditer(text, start):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            pairs[stack.pop()] = m.start()
    return pairs


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """Outermost boxes, left to right: (start, end, content)."""
    first = _BOX.search(text)
    if first is None:
        return []
    pairs = _brace_pairs(text, first.start())
    out: list[tuple[int, int, str]] = []
    for m in _BOX.finditer(text, first.start()):
        if out and m.start() < out[-1][1]:
            continue  # a box inside the previous one
        if m.end() < len(text) and text[m.end()] == "{":
            close = pairs.get(m.end())
            if close is not None:
                out.append((m.start(), close + 1, text[m.end() + 1 : close].strip()))
        elif m.end() < len(text):  # "\boxed 5"
            token = re.match(r"[^\s$]+", text[m.end() : m.end() + 100])
            if token:
                out.append((m.start(), m.end() + token.end(), token.group()))
    return out


def _last_box_group(text: str) -> tuple[int, Answer] | None:
    """(start, answer) of the last box and the boxes written right before it (math-verify's rule:
    less than 10 characters between them, or less than 70 with a separator): several distinct
    contents are one answer, that set."""
    boxes = [b for b in _boxes(text) if b[2]]
    if not boxes:
        return None
    group = [boxes[-1]]
    for prev in reversed(boxes[:-1]):
        gap = text[prev[1] : group[0][0]]
        if len(gap.strip()) < 10 or (len(gap) < 70 and _BOX_SEPARATOR.search(gap)):
            group.insert(0, prev)
        else:
            break
    contents: list[str] = []
    for _, _, content in group:
        if _clean_span(content) not in contents:
            contents.append(_clean_span(content))
    return group[0][0], Answer(", ".join(contents), "boxed", ordered=len(contents) == 1)


# ------------------------------------------------------------------------------------ formulas


def _formulas(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every formula, in one pass over the delimiters: ``$$..$$`` and
    ``\\[..\\]`` may span lines, ``$..$`` and ``\\(..\\)`` may not."""
    out = []
    opened, start = "", 0
    for m in _DELIM.finditer(text):
        tok = m.group()
        if not opened:
            if tok in _CLOSING:
                opened, start = tok, m.end()
        elif tok == _CLOSING[opened] or (opened == "$" and tok == "$$"):
            content = text[start : m.start()]
            if content.strip():
                out.append((start - len(opened), m.end(), content))
            opened = ""
        elif tok == "\n" and opened in ("$", "\\("):
            opened = ""  # an inline formula does not cross a line
    return out


def _join(text: str, formulas: list[tuple[int, int, str]], first: int, last: int) -> Answer:
    """Formulas ``first..last`` as one answer: one formula, or several joined by separators only
    ("$3$ or $4$" is the set {3, 4}); a percent sign right after a formula stays with it."""
    texts = []
    for _, end, content in formulas[first : last + 1]:
        suffix = "\\%" if _PERCENT_AFTER.match(text, end) else ""
        texts.append(_clean_span(content) + suffix)
    return Answer(", ".join(texts), "formula", ordered=first == last)


def _joined(text: str, formulas: list, i: int, j: int) -> bool:
    """Formulas i and j are one answer: only separators between them, or a short gap with "or"
    ("$3$, or maybe $4$" is a hedge, never the first of the two)."""
    gap = text[formulas[i][1] : formulas[j][0]]
    return _JOINER.fullmatch(gap) is not None or (len(gap) < 40 and _OR.search(gap) is not None)


def _last_formula(text: str) -> tuple[int, Answer] | None:
    """(end, answer) of the last formula, with the formulas joined to it before it."""
    formulas = _formulas(text)
    if not formulas:
        return None
    first = last = len(formulas) - 1
    while first > 0 and _joined(text, formulas, first - 1, first):
        first -= 1
    return formulas[last][1], _join(text, formulas, first, last)


def _whole_formula(s: str) -> str | None:
    formulas = _formulas(s)
    if len(formulas) == 1 and formulas[0][0] == 0 and formulas[0][1] == len(s):
        return formulas[0][2]
    return None


# ------------------------------------------------------------------------------------ markers


def _last_marker(text: str) -> tuple[int, Answer] | None:
    """(position, answer) of the last answer marker that is followed by an answer."""
    markers = list(_MARKER.finditer(text))
    for m in reversed(markers[-_MAX_MARKERS:]):
        span = _span_after(text[m.end() : m.end() + MAX_SPAN_CHARS])
        if span is not None:
            return m.start(), span
    return None


def _span_after(rest: str) -> Answer | None:
    """The answer a marker introduces: its display formula, or the rest of its sentence (the next
    line when the marker ends its own line, as in "**Final Answer**")."""
    rest = rest.lstrip(" \t*:")
    if rest.startswith("\n"):
        rest = rest.lstrip("\n \t*:")
    formulas = _formulas(rest)
    if formulas and formulas[0][0] == 0 and rest.startswith(("$$", "\\[")):
        return _join(rest, formulas, 0, _joined_run(rest, formulas))
    line = _cut_sentence(rest.split("\n", 1)[0])
    boxed = _last_box_group(line)
    if boxed is not None:
        return boxed[1]
    line = _after_copula(line).strip().strip("*").strip()
    formulas = _formulas(line)
    if formulas:
        return _join(line, formulas, 0, _joined_run(line, formulas))
    return _reduce_plain(line)


def _joined_run(text: str, formulas: list) -> int:
    last = 0
    while last + 1 < len(formulas) and _joined(text, formulas, last, last + 1):
        last += 1
    return last


def _outside(spans: list[tuple[int, int, str]], pos: int) -> bool:
    return all(not (s <= pos < e) for s, e, _ in spans)


def _cut_sentence(line: str) -> str:
    """The line up to the end of its first sentence, never cutting inside a formula."""
    spans = _formulas(line)
    for m in _SENTENCE_END.finditer(line):
        if _outside(spans, m.start()):
            return line[: m.start()]
    return line


def _after_copula(line: str) -> str:
    """ "The volume of $ABCD$ is 120" → " 120": what follows the last "is" outside formulas."""
    spans = _formulas(line)
    cuts = [m.end() for m in _COPULA.finditer(line) if _outside(spans, m.start())]
    return line[cuts[-1] :] if cuts and line[cuts[-1] :].strip() else line


def _reduce_plain(line: str) -> Answer | None:
    """A marker's plain-text answer: "120", "7 apples", "3 or 4", "odd"; in a sentence with
    numbers, its last number ("Jane started 3 hours ago" → 3)."""
    line = re.sub(r"(?<!\\)\$", " ", line).strip()  # an unclosed "$" is not a formula
    if not line:
        return None
    prose = _PROSE_WORD.search(_TEXT_BRACES.sub(" ", line)) and not _LEADING_NUMBER_WORDS.match(
        line
    )
    if prose or _OR.search(line):
        number = _last_number(line)
        if number is not None:
            return Answer(number[1].text, "marker", math=False, ordered=number[1].ordered)
    return Answer(_clean_span(line), "marker", math=_looks_latex(line))


# ------------------------------------------------------------------------ bare, last number


def _is_bare(s: str) -> bool:
    """The whole completion is one answer: short, one line, at most two words of prose."""
    if len(s) > _BARE_MAX_CHARS or "\n" in s or _BOX.search(s) or _MARKER.search(s):
        return False
    if _BARE_STOP.search(s) or (_DELIM.search(s) and _whole_formula(s) is None):
        return False
    return len(_WORD.findall(_TEXT_BRACES.sub(" ", s))) <= 2


def _last_number(text: str) -> tuple[int, Answer] | None:
    """(end, answer) of the last number that is not part of a word. A run "3, 4" there, or a
    sentence with "or" between its numbers ("3, or maybe 4"), is the set of those numbers: a
    hedge equals only a reference that is that set."""
    runs = list(_NUMBER_RUN.finditer(text))
    for run in reversed(runs):
        numbers = [m for m in _NUMBER.finditer(run.group()) if _standalone(text, run.start(), m)]
        if not numbers or numbers[-1].end() != len(run.group()):
            continue
        values = [m.group() for m in numbers]
        start = max(text.rfind(". ", 0, run.start()), text.rfind("\n", 0, run.start())) + 1
        sentence = text[start : run.start()]
        if _OR.search(sentence + run.group()):
            earlier = [
                m.group()
                for m in _NUMBER.finditer(sentence)
                if _standalone(text, start, m) and m.group() not in values
            ]
            values = earlier + values
        answer = Answer(", ".join(values), "last_number", math=False, ordered=len(values) == 1)
        return run.end(), answer
    return None


def _standalone(text: str, offset: int, m: re.Match) -> bool:
    end = offset + m.end()
    glued = re.match(r"[A-Za-z]+", text[end : end + 8])
    if glued is None:
        return True
    after = text[end + glued.end() : end + glued.end() + 1]
    return glued.group().lower() in _GLUED_UNITS or after in ("²", "³")


def _looks_latex(s: str) -> bool:
    return any(ch in s for ch in "\\^_{}$")


def _clean_span(s: str) -> str:
    """Drop what dresses an answer but is not part of it: outer ``$``, ``**``, trailing
    punctuation and a stray trailing backslash."""
    s = s.strip()
    inner = _whole_formula(s)
    if inner is not None:
        s = inner.strip()
    s = s.strip("*").strip()
    while True:  # rstrip, not a `+$` regex: linear on long runs of spaces
        cut = s.rstrip(" \t\r\n.,;:").rstrip("\\")
        if cut == s:
            return s
        s = cut
