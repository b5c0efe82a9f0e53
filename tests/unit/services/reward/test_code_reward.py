import ast
import builtins
import json
import math
import os
import signal

import pytest

from services.reward.base import ScoreItem
from services.reward.functions.code_reward import (
    CodeReward,
    extract_code,
    interpret,
    parse_reference,
)
from services.reward.config import CodeSpec
from services.reward.sandbox import checker


def test_reference_formats():
    assert parse_reference('{"tests": ["assert f(1) == 2"], "setup": "import math"}') == (
        "import math",
        ["assert f(1) == 2"],
    )
    assert parse_reference('["assert a", "assert b"]') == ("", ["assert a", "assert b"])
    assert parse_reference("assert f(1) == 2\n# comment\n\nassert f(2) == 3") == (
        "",
        ["assert f(1) == 2", "assert f(2) == 3"],
    )


@pytest.mark.parametrize(
    "ref,fix",
    [
        ("{not json", "does not parse"),
        ('{"tests": []}', "no tests"),
        ('{"tests": "assert x"}', "list of strings"),
        ('{"tests": ["assert x"], "extra": 1}', "unknown reference keys"),
        ('{"tests": ["assert x"], "setup": 3}', "setup"),
        ("", "no tests"),
        ('["assert f(1) == 2", "x = f(1)"]', "test 1 must be one assert statement"),
        ('["check(f)"]', "test 0 must be one assert statement"),
        ('["assert f(1) == 2\\nassert f(2) == 3"]', "test 0 must be one assert statement"),
        ('["assert f(1) =="]', "test 0 does not parse"),
    ],
)
def test_bad_references_say_what_to_write(ref, fix):
    with pytest.raises(ValueError, match=fix):
        parse_reference(ref)


def test_extract_code_takes_the_last_fenced_block():
    text = "Idea:\n```python\ndef f(): return 1\n```\nBetter:\n```py\ndef f(): return 2\n```\n"
    assert extract_code(text) == "def f(): return 2\n"
    assert extract_code("def f(): return 3") == "def f(): return 3"


def _answer(*lines, **kw):
    return dict(
        {
            "exit": 0,
            "signal": None,
            "wall_s": 0.01,
            "cpu_s": 0.01,
            "killed": "",
            "lines": list(lines),
        },
        **kw,
    )


SYN, RUN, DONE = {"stage": "syntax", "ok": True}, {"stage": "run", "ok": True}, {"stage": "done"}


def _test(i, ok, error=None):
    return {"stage": "test", "index": i, "ok": ok, "error": error}


@pytest.mark.parametrize(
    "mode,reward", [("binary", 0.0), ("partial", 2 / 3), ("shaped", 0.1 + 0.2 + 0.7 * 2 / 3)]
)
def test_modes(mode, reward):
    s = interpret(
        _answer(
            SYN,
            RUN,
            _test(0, True),
            _test(1, True),
            _test(2, False, {"type": "AssertionError"}),
            DONE,
        ),
        3,
        CodeSpec(mode=mode),
    )
    assert s.status == "ok" and s.reward == pytest.approx(reward)
    assert s.components["tests_passed"] == 2 and "1/3 tests failed" in s.detail


def test_intermediate_rewards_for_syntax_and_runtime_errors():
    shaped = CodeSpec(mode="shaped")
    bad_syntax = interpret(
        _answer({"stage": "syntax", "ok": False, "error": {"type": "SyntaxError"}}), 2, shaped
    )
    assert (
        bad_syntax.reward == 0 and bad_syntax.status == "ok" and "syntax error" in bad_syntax.detail
    )
    raised = interpret(
        _answer(SYN, {"stage": "run", "ok": False, "error": {"type": "NameError", "message": "x"}}),
        2,
        shaped,
    )
    assert raised.reward == pytest.approx(0.1) and "NameError" in raised.detail


def test_limits_and_denials_score_zero_with_the_reason():
    spec = CodeSpec(mode="shaped")
    cases = [
        (_answer(SYN, killed="wall", signal=signal.SIGKILL), "timeout", "wall-time"),
        (_answer(SYN, signal=signal.SIGXCPU), "timeout", "CPU-time"),
        (
            _answer(SYN, {"stage": "run", "ok": False, "error": {"type": "MemoryError"}}),
            "error",
            "memory limit",
        ),
        (
            _answer(
                SYN,
                RUN,
                _test(
                    0, False, {"type": "OSError", "errno": 101, "message": "Network is unreachable"}
                ),
            ),
            "error",
            "network",
        ),
        (
            _answer(
                SYN,
                {"stage": "run", "ok": False, "error": {"type": "BlockingIOError", "errno": 11}},
            ),
            "error",
            "process limit",
        ),
        (_answer(SYN, signal=signal.SIGSEGV), "error", "SIGSEGV"),
        (_answer(SYN, RUN), "error", "exited before the tests finished"),
        ({"runner_error": "sandbox runner exited"}, "error", "runner exited"),
    ]
    for answer, status, why in cases:
        s = interpret(answer, 1, spec)
        assert (s.reward, s.status) == (0.0, status) and why in s.detail, (answer, s)


def test_guard_mode_refuses_network_writes_and_processes(tmp_path):
    """Guard mode is the fallback without root; it must refuse these through its audit hook."""
    # wall_s: a verdict is expected from each, never the wall (a loaded machine's jobs took 2-5 s)
    fn = CodeReward("code", CodeSpec(isolation="guard", wall_s=10.0, concurrency=2))
    target = tmp_path / "pwned"
    tmp_path.chmod(0o777)
    ref = json.dumps({"tests": ["assert True"]})
    cases = {
        "ok": "x = 1",
        "net": "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))",
        "dns": "import socket\nsocket.create_connection(('example.com', 80), timeout=1)",
        "write": f"open({str(target)!r}, 'w').write('x')",
        "fork": "import os\nos.fork()",
        "exec": "import os\nos.system('true')",
        "proc": f"open('/proc/{os.getpid()}/environ').read()",
        "kill": f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)",
    }
    try:
        scores = fn.score_batch([ScoreItem(k, "", v, ref) for k, v in cases.items()])
        assert fn.pool.isolation == "guard"
        got = dict(zip(cases, scores))
        assert got["ok"].reward == 1.0 and got["ok"].status == "ok"
        for key in ("net", "dns", "write", "fork", "exec", "proc", "kill"):
            assert got[key].reward == 0 and got[key].status == "error", (key, got[key])
            assert "sandbox" in got[key].detail
        assert not target.exists()
    finally:
        fn.close()


def test_a_broken_protocol_scores_zero():
    """The checker says so when the completion's process wrote what the protocol does not allow."""
    tamper = {"stage": "tamper", "detail": "a line that is not a JSON object"}
    s = interpret(_answer(SYN, RUN, _test(0, True), tamper), 1, CodeSpec(mode="partial"))
    assert (s.reward, s.status) == (0.0, "error") and "broke the checker's protocol" in s.detail


PLAIN = [
    None,
    True,
    0,
    -(2**100),
    2**53,
    1.5,
    -0.0,
    math.inf,
    2 - 3j,
    "é\ud800",
    b"\x00\xff",
    [1, [2, (3,)]],
    (),
    {"a": {1: frozenset({2})}, (1, "x"): None},
    {1, 2.5, "s"},
]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_data_round_trips_with_exact_types(value):
    back = checker.decode(json.loads(json.dumps(checker.encode(value))))
    assert back == value and repr(back) == repr(value)
    assert checker.decode(checker.encode(math.nan)) != checker.decode(checker.encode(math.nan))


class _Meta(type):
    def __eq__(cls, other):
        return True

    __hash__ = type.__hash__


class _Lies(metaclass=_Meta):
    pass


@pytest.mark.parametrize(
    "value",
    [
        type("I", (int,), {})(3),
        type("S", (str,), {})("x"),
        type("L", (list,), {})(),
        type("D", (dict,), {})(),
        bytearray(b"x"),
        _Lies(),
        [1, object()],
        {1: len},
        iter([1]),
    ],
    ids=lambda v: type(v).__name__,
)
def test_anything_else_is_not_plain_data(value):
    with pytest.raises(checker.NotPlainData):
        checker.encode(value)


def test_deep_nesting_is_refused_both_ways():
    deep: list = []
    for _ in range(checker.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(checker.NotPlainData, match="nested deeper"):
        checker.encode(deep)
    tree: list = ["l"]
    for _ in range(checker.MAX_DEPTH + 1):
        tree = ["l", tree]
    with pytest.raises(ValueError):
        checker.decode(tree)


@pytest.mark.parametrize(
    "tree",
    [{"a": 1}, ["?"], [], [1], ["s", ["l"]], ["d", ["l"], 1], ["d", 1], ["i", 5], ["c", "1", 2]],
    ids=repr,
)
def test_decode_refuses_what_encode_never_writes(tree):
    with pytest.raises(ValueError):
        checker.decode(tree)


def _plan(test: str, known=("math", "CASES")):
    planner = checker.Planner(lambda name: name in known or name in vars(builtins))
    tree = planner.plan(checker.parse_test(test, 0).test)
    return ast.unparse(tree.body), planner.chains


@pytest.mark.parametrize(
    "test,chains,planned",
    [
        ("assert add(2, 3) == 5", ["add(2, 3)"], "__brorl_probe__(0, {}) == 5"),
        (
            "assert abs(f(x) - 1.5) < 1e-06",
            ["f(x)"],
            "abs(__brorl_probe__(0, {}) - 1.5) < 1e-06",
        ),
        ("assert len(dup('ab')) == 4", ["dup('ab')"], "len(__brorl_probe__(0, {})) == 4"),
        ("assert Stack().pop() == math.pi", ["Stack().pop()"], None),
        ("assert f(f(2))[0].real is None", ["f(f(2))[0].real"], None),
        (
            "assert all(sq(i) == o for i, o in CASES)",
            ["sq(i)"],
            "all((__brorl_probe__(0, {'i': i}) == o for i, o in CASES))",
        ),
        ("assert sorted(xs, key=lambda v: g(v))", ["xs", "g(v)"], None),
        ("assert math.isclose(1, 1)", [], "math.isclose(1, 1)"),
    ],
)
def test_planner_sends_only_the_completions_chains(test, chains, planned):
    """Everything but the chains rooted at the completion's names stays in the checker: the
    expected values, the comparisons, builtins like len/abs and setup names like math."""
    got, got_chains = _plan(test)
    assert got_chains == chains
    if planned:
        assert got == planned
