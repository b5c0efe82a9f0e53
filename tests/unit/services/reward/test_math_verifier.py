"""math_answer end to end on ScoreItems (extraction + comparison + workers), exact_match, format."""

import subprocess
import sys

import pytest

from brorl.contract import RewardStatus
from services.reward.base import ScoreItem
from services.reward.config import MathAnswerSpec
from services.reward.functions.math_verifier import FormatReward, MathAnswer


@pytest.fixture(scope="module")
def math_answer():
    fn = MathAnswer()
    yield fn
    fn.close()


def rewards(fn, pairs):
    return [
        s.reward
        for s in fn.score_batch([ScoreItem(str(i), "", c, r) for i, (c, r) in enumerate(pairs)])
    ]


# What the issue found unequal that is equal (completion, reference).
EQUAL = [
    ("The interval is $[-4, 0]$.", "[-4,0]"),
    ("\\boxed{\\frac{1}{\\sqrt2}}", "\\frac{\\sqrt2}{2}"),
    ("\\boxed{\\sqrt{\\sqrt{16}}}", "2"),
    ("The count is $14{,}916$.", "14916"),
    ("So it costs $\\$16,\\!386.20$.", "16386.2"),
    ("1 000", "1000"),
    ("$\\cfrac{1}{3}$", "1/3"),
    ("\\boxed{\\frac94}", "2.25"),
    (
        "\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}}",
        "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}",
    ),
    ("\\boxed{y=-\\frac12x+\\frac34}", "2x+4y-3=0"),
    ("The answer is 25 percent.", "25\\%"),
    ("The answer is 7 apples.", "7"),
    ("\\boxed{5\\text{ cm}}", "5"),
    ("\\boxed{\\text{(A)}}", "(A)"),
    ("098", "98"),
    ("x = 5", "5"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{(1, 2)}", "(1,2)"),
]
DIFFERENT = [
    ("\\boxed{\\text{(A)}}", "\\text{(B)}"),
    ("AZYUK2A", "2"),
    ("\\boxed{x \\geq 5}", "5"),
    ("\\boxed{(2, 1)}", "(1,2)"),
    ("0.333", "1/3"),
    ("\\boxed{x^2+2x}", "(x+1)^2"),
    ("10, 4, -2", "4, 10, -2"),  # a list of numbers is ordered (MATH's own grader)
]


def test_equal_answers(math_answer):
    assert rewards(math_answer, EQUAL) == [1.0] * len(EQUAL)


def test_different_answers(math_answer):
    assert rewards(math_answer, DIFFERENT) == [0.0] * len(DIFFERENT)


def test_math_answer_fast_for_plain_integers_without_sympy():
    code = (
        "import sys, time\n"
        "from services.reward.base import ScoreItem\n"
        "from services.reward.functions.math_verifier import MathAnswer\n"
        "items = [ScoreItem(str(i), '', str(i), str(i if i % 2 else i + 1)) for i in range(512)]\n"
        "fn = MathAnswer(); start = time.process_time(); scores = fn.score_batch(items)\n"
        "assert time.process_time() - start < 0.5\n"
        "assert [s.reward for s in scores] == [float(i % 2) for i in range(512)]\n"
        "assert not {'sympy', 'math_verify'} & set(sys.modules), 'the integer path loaded sympy'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_math_answer_without_answer(math_answer):
    [s] = math_answer.score_batch([ScoreItem("a", "p", "I do not know", "4")])
    assert s.reward == 0 and s.detail == "no answer found" and s.components["has_answer"] == 0
    assert s.status == RewardStatus.OK


def test_an_unusable_reference_is_an_error_not_a_wrong_answer(math_answer):
    [empty, garbage] = math_answer.score_batch(
        [ScoreItem("a", "", "4", "  "), ScoreItem("b", "", "\\boxed{x+1}", "\\frac{}{")]
    )
    assert empty.status == garbage.status == RewardStatus.ERROR
    solution = MathAnswer("m", MathAnswerSpec(reference_kind="solution"))
    [s] = solution.score_batch([ScoreItem("a", "", "4", "We add the numbers.")])
    assert s.status == RewardStatus.ERROR and "reference_kind: solution" in s.detail


def test_solution_references_are_extracted_like_completions():
    fn = MathAnswer("m", MathAnswerSpec(reference_kind="solution"))
    gsm8k = "She sold 48/2 = 24 clips in May.\nIn all 48+24 = 72 clips.\n#### 72"
    math = "Adding, $2+3=5$, so the sum is $\\boxed{5}$."
    try:
        assert rewards(fn, [("72", gsm8k), ("24", gsm8k), ("so \\boxed{5}", math)]) == [1, 0, 1]
    finally:
        fn.close()
    # read as an answer, a solution is an error naming the fix, never a silent 0 for every path
    [s] = MathAnswer().score_batch([ScoreItem("a", "", "72", gsm8k)])
    assert s.status == RewardStatus.ERROR and "reference_kind: solution" in s.detail


def test_identical_answers_in_a_batch_are_compared_once(math_answer):
    calls = []
    pool = math_answer._workers()
    run = pool.run
    pool.run = lambda jobs: calls.append(len(jobs)) or run(jobs)
    reference = "\\frac{1}{\\sqrt{2}}"
    try:
        items = [
            ScoreItem(str(i), "", f"so \\boxed{{\\frac{{\\sqrt{{{i % 3 + 1}}}}}{{2}}}}", reference)
            for i in range(64)
        ]
        items += [ScoreItem("same", "", "so it is $\\sqrt{2}/2$", reference)] * 64
        scores = math_answer.score_batch(items)
    finally:
        pool.run = run
    assert [s.reward for s in scores[:3]] == [0.0, 1.0, 0.0] and scores[-1].reward == 1.0
    assert calls == [4]  # sqrt(1)/2, sqrt(2)/2, sqrt(3)/2 and sqrt(2)/2 written another way


def test_format_reward_default_and_custom_pattern():
    items = [
        ScoreItem("a", "", "42", ""),
        ScoreItem("b", "", "\\boxed{7}", ""),
        ScoreItem("c", "", "it is 4", ""),
    ]
    assert [s.reward for s in FormatReward().score_batch(items)] == [1.0, 1.0, 0.0]
    assert [s.reward for s in FormatReward("f", r"^it is \d+$").score_batch(items)] == [
        0.0,
        0.0,
        1.0,
    ]


def test_exact_match_is_stricter_than_math_answer():
    from services.reward.functions.math_verifier import ExactMatch

    items = [
        ScoreItem("a", "", "098", "98"),
        ScoreItem("b", "", " 98 ", "98"),
        ScoreItem("c", "", "97", "98"),
    ]
    assert [s.reward for s in ExactMatch().score_batch(items)] == [0.0, 1.0, 0.0]
    assert [s.reward for s in MathAnswer().score_batch(items)] == [1.0, 1.0, 0.0]
