"""Which part of a completion is its answer (services/reward/functions/math_extract.py): pure
functions on irregular text, and their cost on hostile text."""

import time

import pytest

from services.reward.functions.math_extract import (
    extract_answer,
    looks_like_solution,
    read_reference,
)


@pytest.mark.parametrize(
    "text,answer",
    [
        ("432", "432"),
        ("  -17 ", "-17"),
        ("\\frac{10}{9}", "\\frac{10}{9}"),  # not its last number, 9
        ("x \\geq 5", "x \\geq 5"),  # not 5
        ("$x \\geq 5$", "x \\geq 5"),
        ("so the total is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed {7}", "7"),
        ("\\fbox{8} is it", "8"),
        ("\\boxed 5 apples", "5"),
        ("nested \\boxed{\\frac{\\sqrt{2}}{\\boxed{2}}}", "\\frac{\\sqrt{2}}{\\boxed{2}}"),
        ("The answer is 3/4.", "3/4"),
        ("the answer is: $\\frac{3}{4}$, since 3/4 of it is left", "\\frac{3}{4}"),
        ("Answer: 12", "12"),
        ("answer: 7 apples", "7 apples"),  # the unit is dropped when answers are compared
        ("Final Answer: The volume of the box is 120.", "120"),  # not the whole sentence
        ("Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "120"),
        ("Final Answer: The final answer is $10,455$. I hope it is correct.", "10,455"),
        ("**Final Answer**\n42", "42"),
        ("Answer \\[ 9 \\]", "9"),
        ("... so the answer is $50$\\%.", "50\\%"),
        ("Natalia sold 48+24 = 72 clips.\n#### 72", "72"),
        ("reasoning #### 1,234", "1,234"),
        ("so $$f(y) = y$$", "f(y) = y"),  # a final formula, not "no answer"
        ("We get $x = 3$. Then the total is 7.", "7"),  # the later of formula and number
        ("we get 12, then 13 more", "13"),
        ("the probability is 2/3. <|im_start|>user", "2/3"),
        ("so the number is 10 which is 1,000.99m²", "1,000.99"),
        ("Soucis : 2,74 $ a..", "2,74"),
        ("odd", "odd"),
        ("\\text{(B)}", "\\text{(B)}"),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text).text == answer


def test_a_later_marker_beats_an_earlier_box_and_a_later_box_beats_a_marker():
    text = "First $\\boxed{255}$.\n\nFinal Answer: The final answer is $10,455$."
    assert extract_answer(text).text == "10,455"
    assert extract_answer("The answer is 41. Recheck: \\boxed{42}").text == "42"
    assert extract_answer("The answer is \\boxed{5}.").text == "5"


@pytest.mark.parametrize(
    "text,answer",
    [
        ("\\boxed{3}, \\boxed{4}", "3, 4"),
        ("\\boxed{3} or maybe \\boxed{4}", "3, 4"),
        ("\\boxed{2} and \\boxed{2}", "2"),  # one value written twice is not a hedge
        ("The answer is $3$ or $4$.", "3, 4"),
        ("The answer is $3$, or maybe $4$.", "3, 4"),
        ("The answer is 3 or 4.", "3, 4"),
        ("The answer is 3, or possibly 4.", "3, 4"),
        ("I think it is 3 or maybe 4", "3, 4"),
        ("and we get 1, 2, 3", "1, 2, 3"),
    ],
)
def test_several_answers_are_one_unordered_answer(text, answer):
    got = extract_answer(text)
    assert got.text == answer
    assert got.ordered is (", " not in answer)


def test_an_earlier_box_far_from_the_last_is_replaced_and_a_near_one_joined():
    far = "\n\nWait, that is wrong. Recomputing every step gives another value, which is\n\n"
    assert extract_answer("\\boxed{3}" + far + "\\boxed{4}").text == "4"
    near = "; no, rather "  # math-verify's rule: < 70 characters with a separator
    assert extract_answer("\\boxed{3}" + near + "\\boxed{4}").text == "3, 4"


@pytest.mark.parametrize(
    "text", ["AZYUK2A", "The molecule is H2O.", "see item12 and row7", "no digits here", ""]
)
def test_no_number_inside_a_word(text):
    got = extract_answer(text)
    assert got is None or not any(ch.isdigit() for ch in got.text) or got.how == "bare"


def test_digits_in_words_are_not_numbers_but_glued_units_are():
    assert extract_answer("Use code A7B, then we call it version3.") is None
    assert extract_answer("The total distance is 42km").text == "42"
    assert extract_answer("so y = 3x").text != "3"


def test_last_number_can_be_turned_off():
    assert extract_answer("we get 12, then 13 more", last_number=False) is None
    assert extract_answer("so $$f(y) = y$$", last_number=False).text == "f(y) = y"


def test_inline_formulas_do_not_cross_lines_and_escaped_dollars_are_not_delimiters():
    assert extract_answer("Answer $ \n 9 \n $", last_number=False) is None
    got = extract_answer("Answer $ \\frac{1}{2} \\$ = \\frac{10}{9} $")
    assert got.text == "\\frac{1}{2} \\$ = \\frac{10}{9}"
    assert extract_answer("It is worth $\\boxed{\\$16386.17}$.").text == "\\$16386.17"


@pytest.mark.parametrize(
    "reference,kind,answer",
    [
        ("42", "answer", "42"),
        ("  $\\frac{1}{2}$ ", "answer", "\\frac{1}{2}"),
        ("\\boxed{033}", "answer", "033"),
        ("x \\in [-2,7]", "answer", "x \\in [-2,7]"),
        ("She sold 48/2 = 24.\nIn all 48+24 = 72.\n#### 72", "solution", "72"),
        ("Adding, $2+3=5$, so the sum is $\\boxed{5}$.", "solution", "5"),
    ],
)
def test_read_reference(reference, kind, answer):
    assert read_reference(reference, kind).text == answer


def test_an_empty_reference_or_a_solution_without_answer_has_none():
    assert read_reference("  ", "answer") is None
    assert read_reference("We add the numbers.", "solution") is None


@pytest.mark.parametrize(
    "text",
    [
        "blah " * 200_000 + " the answer is 3",
        "\\boxed{" * 50_000,
        "$\n" * 100_000,
        "\\(" * 100_000,
        "answer: \n" * 50_000 + "5",
        "1, " * 100_000,
        "{" * 100_000 + "}" * 100_000,
        " " * 500_000 + "x",
        "\\boxed{" + " " * 500_000 + "1}",
    ],
    ids=lambda text: f"{text[:12]!r}x{len(text)}",
)
def test_extraction_is_linear_on_hostile_text(text):
    """CPU seconds of this process, not wall time: a loaded machine slows the clock, not the
    work (a quadratic scan of these 0.2-1 M characters would take minutes either way). The
    bound leaves room for the slowest VMs: the slowest case, "1, " x 100,000, takes 0.85 s of
    CPU alone on a slow AVX2 EPYC and took 2.08 s there beside the suite's other lane."""
    start = time.process_time()
    extract_answer(text)
    read_reference(text, "solution")
    assert time.process_time() - start < 6.0


@pytest.mark.parametrize(
    "reference,solution",
    [
        ("She sold 72 clips.\n#### 72", True),
        ("reasoning #### 1,234", True),
        ("so the answer is $\\boxed{5}$.", True),
        ("\\boxed{5}", False),
        ("$\\boxed{5}$", False),
        ("72", False),
        ("#### Step 1", False),  # a markdown heading
        ("\\text{The midpoints form a hexagon}", False),
    ],
)
def test_a_worked_solution_is_recognised(reference, solution):
    assert looks_like_solution(reference) is solution
