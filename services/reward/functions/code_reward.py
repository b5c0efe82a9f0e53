"""Code reward: run a completion against unit tests in the sandbox
(sandbox/pool.py / sandbox/runner.py).

Reference format (the ``reference`` field of a ScoreRequest):
  * a JSON object ``{"tests": ["assert f(1) == 2", ...], "setup": "import math"}`` — each test is
    one ``assert`` statement; ``setup`` (optional, trusted) runs before the completion and again,
    alone, in the checking process;
  * or a JSON list of tests;
  * or plain text: one test per non-empty line that is not a comment.
Tests compare plain data only (sandbox/harness.py, sandbox/checker.py): the completion runs in a
process of its own, which only answers what the completion's chains (``f(1)``, ``Stack().pop()``)
evaluate to, as plain built-in data; the rest of each test — the expected values, the comparison,
builtins and setup helpers — is evaluated in a checking process the completion cannot reach. So
``__eq__`` overrides, subclasses of int/str/list, patched builtins, early exits and forged reports
do not pass a test.
The code is the last fenced block of the completion (```python ... ```), else the whole completion;
with ``prepend_prompt`` the prompt is put in front (HumanEval style: the prompt holds the
signature).

Status: ok — a verdict (tests passed or not, syntax errors and exceptions included); timeout — the
wall-time or CPU-time limit stopped it; error — a sandbox limit or denial stopped it (memory,
processes, file size, disk, network, writing outside its directory, other processes), it exited
before the tests finished or broke the checker's protocol, or the reference/infrastructure failed.
Anything but ok scores 0.
"""

from __future__ import annotations

import errno
import json
import re
import signal

from brorl.contract import RewardStatus
from services.reward.base import Score, ScoreItem
from services.reward.config import BUILTIN_FUNCTIONS, CodeSpec
from services.reward.sandbox.checker import parse_test
from services.reward.sandbox.pool import SandboxPool, SandboxSettings

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_NETWORK_ERRNOS = {
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.EHOSTUNREACH,
    errno.EADDRNOTAVAIL,
    errno.EAFNOSUPPORT,
    errno.ECONNREFUSED,
}
_NETWORK_TEXT = (
    "Network is unreachable",
    "name resolution",
    "Name or service not known",
    "network access",
)


def parse_reference(text: str, max_tests: int = 200) -> tuple[str, list[str]]:
    """(setup, tests) from a reference; ValueError saying what the reference should look like."""
    stripped = text.strip()
    setup, tests = "", None
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise ValueError(
                f"reference looks like JSON but does not parse ({exc}); "
                'write {"tests": ["assert f(1) == 2", ...]}'
            ) from None
        if isinstance(data, dict):
            unknown = set(data) - {"tests", "setup"}
            if unknown:
                raise ValueError(f"unknown reference keys {sorted(unknown)}; allowed: tests, setup")
            tests, setup = data.get("tests"), data.get("setup", "")
        else:
            tests = data
        if not isinstance(setup, str):
            raise ValueError("reference 'setup' must be a string of Python code")
    else:
        tests = [
            line
            for line in stripped.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise ValueError("reference 'tests' must be a list of strings of Python code")
    if not tests:
        raise ValueError('reference has no tests; give {"tests": ["assert f(1) == 2", ...]}')
    if len(tests) > max_tests:
        raise ValueError(f"reference has {len(tests)} tests; at most {max_tests} (code.max_tests)")
    for index, test in enumerate(tests):
        parse_test(test, index)  # one assert statement each: only those are checked as plain data
    return setup, tests


def extract_code(completion: str) -> str:
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion.strip("\n")


def sandbox_violation(error: dict | None, spec: CodeSpec) -> str | None:
    """Why a sandbox limit or denial caused ``error`` (a harness error record), or None if it did
    not."""
    if not error:
        return None
    kind, code, msg, fname = (
        error.get("type"),
        error.get("errno"),
        error.get("message") or "",
        error.get("filename"),
    )
    if "sandbox guard:" in msg:
        return msg[msg.index("sandbox guard:") :]
    if kind == "MemoryError" or code == errno.ENOMEM:
        return f"memory limit ({spec.memory_mb} MB) exceeded"
    if kind == "BlockingIOError" and code == errno.EAGAIN:
        return f"process limit ({spec.nproc} processes) reached"
    if code in _NETWORK_ERRNOS or kind == "gaierror" or any(t in msg for t in _NETWORK_TEXT):
        return f"network access is disabled ({kind}: {msg[:120]})"
    if code == errno.EROFS:
        return f"writing outside the sandbox directory was denied ({fname or msg[:120]})"
    if code == errno.EACCES:
        if fname and fname.startswith("/proc/"):
            return f"reading another process's data was denied ({fname})"
        return f"access outside the sandbox directory was denied ({fname or msg[:120]})"
    if code == errno.EPERM:
        return (
            "operation not permitted in the sandbox, e.g. signalling a process outside the job "
            f"({msg[:120]})"
        )
    if code == errno.ESRCH:
        return "no such process: processes outside the sandbox are invisible to it"
    if code == errno.EFBIG:
        return f"file-size limit ({spec.file_size_mb} MB) exceeded"
    if code == errno.ENOSPC:
        return f"sandbox disk ({spec.disk_mb} MB) is full"
    if code == errno.EMFILE:
        return f"open-file limit ({spec.nofile}) reached"
    return None


def _brief(error: dict | None) -> str:
    if not error:
        return ""
    return f"{error.get('type')}: {(error.get('message') or '')[:200]}".rstrip(": ")


def interpret(answer: dict, n_tests: int, spec: CodeSpec) -> Score:
    """Turn the runner's answer for one job into a Score."""
    if "runner_error" in answer:
        return Score(0.0, status=RewardStatus.ERROR, detail=answer["runner_error"])
    stage, results, comps = _report(answer, n_tests)
    latency = float(answer.get("wall_s") or 0.0) * 1000
    failure = _failure(answer, stage, results, comps, spec)
    if failure is not None:
        status, detail = failure
        return Score(0.0, status=status, detail=detail, components=comps, latency_ms=latency)
    syntax_ok, runs_ok = bool(comps["syntax_ok"]), bool(comps["runs_ok"])
    if not syntax_ok:
        detail = "syntax error: " + _brief(stage["syntax"].get("error"))
    elif not runs_ok and "run" in stage:
        detail = "the code raised: " + _brief(stage["run"].get("error"))
    else:
        failed = [i for i in range(n_tests) if results.get(i, {}).get("ok") is not True]
        detail = (
            ""
            if not failed
            else f"{len(failed)}/{n_tests} tests failed; first: test {failed[0]}: "
            + _brief(results.get(failed[0], {}).get("error"))
        )
    if spec.mode == "binary":
        reward = 1.0 if runs_ok and n_tests and comps["tests_passed"] == n_tests else 0.0
    elif spec.mode == "partial":
        reward = comps["pass_rate"]
    else:
        total = spec.syntax_weight + spec.runs_weight + spec.tests_weight
        reward = (
            spec.syntax_weight * syntax_ok
            + spec.runs_weight * runs_ok
            + spec.tests_weight * comps["pass_rate"]
        ) / total
    return Score(
        reward, status=RewardStatus.OK, detail=detail, components=comps, latency_ms=latency
    )


def _report(answer: dict, n_tests: int) -> tuple[dict, dict, dict[str, float]]:
    """The harness's report lines by stage, the test results by index, and the components."""
    lines = [ln for ln in answer.get("lines", []) if isinstance(ln, dict)]
    stage = {
        ln.get("stage"): ln
        for ln in lines
        if ln.get("stage") in ("syntax", "run", "done", "tamper")
    }
    results = {
        ln.get("index"): ln
        for ln in lines
        if ln.get("stage") == "test" and isinstance(ln.get("index"), int)
    }
    passed = sum(1 for i in range(n_tests) if results.get(i, {}).get("ok") is True)
    comps = {
        "syntax_ok": float(bool(stage.get("syntax", {}).get("ok"))),
        "runs_ok": float(bool(stage.get("run", {}).get("ok"))),
        "tests_passed": float(passed),
        "tests_total": float(n_tests),
        "pass_rate": passed / n_tests if n_tests else 0.0,
        "cpu_s": float(answer.get("cpu_s") or 0.0),
    }
    return stage, results, comps


def _failure(answer: dict, stage: dict, results: dict, comps, spec) -> tuple[str, str] | None:
    """(status, detail) when the run itself failed: a limit, a sandbox violation, a signal, a
    broken protocol or a missing report; None when the code ran and the tests reported."""
    sig = answer.get("signal")
    if answer.get("killed") == "wall":
        return RewardStatus.TIMEOUT, f"wall-time limit ({spec.wall_s:g}s) exceeded"
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and comps["cpu_s"] >= spec.cpu_s * 0.9):
        return RewardStatus.TIMEOUT, f"CPU-time limit ({spec.cpu_s:g}s) exceeded"
    if "tamper" in stage:
        why = str(stage["tamper"].get("detail") or "")[:200]
        return RewardStatus.ERROR, f"sandbox: the completion broke the checker's protocol ({why})"
    syntax_failed = not comps["syntax_ok"] and "syntax" in stage
    errors = [
        stage.get("syntax", {}).get("error") if syntax_failed else None,
        stage.get("run", {}).get("error"),
    ] + [r.get("error") for r in results.values()]
    for error in errors:
        why = sandbox_violation(error, spec)
        if why:
            return RewardStatus.ERROR, f"sandbox: {why}"
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else str(sig)
        hint = (
            " (likely the memory or stack limit)"
            if sig in (signal.SIGSEGV, signal.SIGKILL, signal.SIGBUS)
            else ""
        )
        return RewardStatus.ERROR, f"sandbox: killed by {name}{hint}"
    if "syntax" not in stage:
        return RewardStatus.ERROR, (
            f"sandbox harness produced no report (exit code {answer.get('exit')})"
        )
    runs_failed = not comps["runs_ok"] and "run" in stage
    if comps["syntax_ok"] and not runs_failed and "done" not in stage:
        return RewardStatus.ERROR, (
            f"the program exited before the tests finished (exit code {answer.get('exit')})"
        )
    return None


class CodeReward:
    description = BUILTIN_FUNCTIONS["code"].description

    def __init__(self, name: str = "code", spec: CodeSpec | None = None):
        self.name = name
        self.spec = spec or CodeSpec()
        s = self.spec
        self.pool = SandboxPool(
            SandboxSettings(
                wall_s=s.wall_s,
                cpu_s=s.cpu_s,
                memory_mb=s.memory_mb,
                file_size_mb=s.file_size_mb,
                disk_mb=s.disk_mb,
                nproc=s.nproc,
                nofile=s.nofile,
                concurrency=s.concurrency,
                isolation=s.isolation,
                uid_base=s.uid_base,
            )
        )

    def score_batch(self, items: list[ScoreItem]) -> list[Score]:
        scores: list[Score | None] = [None] * len(items)
        jobs, where, counts = [], [], []
        for i, item in enumerate(items):
            try:
                setup, tests = parse_reference(item.reference, self.spec.max_tests)
            except ValueError as exc:
                scores[i] = Score(0.0, status=RewardStatus.ERROR, detail=f"reference: {exc}")
                continue
            code = extract_code(item.completion)
            if self.spec.prepend_prompt:
                code = item.prompt + code
            if len(code) > self.spec.max_code_chars:
                limit = self.spec.max_code_chars
                scores[i] = Score(
                    0.0,
                    status=RewardStatus.ERROR,
                    detail=f"code has {len(code)} chars; more than code.max_code_chars={limit}",
                )
                continue
            jobs.append({"code": code, "setup": setup, "tests": tests})
            where.append(i)
            counts.append(len(tests))
        for i, n, answer in zip(where, counts, self.pool.run(jobs)):
            scores[i] = interpret(answer, n, self.spec)
        return scores  # type: ignore[return-value]

    def close(self) -> None:
        self.pool.close()
