"""Runs one sandboxed job as two processes and reports its stages as JSON lines.

The job process forks the completion's process before any of the completion's code runs, then
becomes the checker. The completion's process compiles and runs the code (after ``setup``) and
answers the checker's questions: the value of a chain such as ``add(2, 3)``, as plain data
(checker.py). The checker runs ``setup`` itself, evaluates each ``assert`` test with those
values, and alone holds the report pipe and its nonce. Why two processes: code that runs in an
interpreter owns it — it can define ``__eq__`` to always hold, patch builtins, rewrite the
harness, read the tests or write fake reports — so the tests, the expected values and the
comparisons live where the completion cannot reach (another uid when root, not dumpable, so no
signals, ptrace or /proc/<pid>/mem). The completion can only choose the values it returns.

Standard library only (loaded by runner.py under ``python -I -S``). Also holds the guard used
when kernel isolation is unavailable: an audit hook that refuses network, writes outside the job
directory, other processes' /proc, signals, ctypes and starting programs. The guard is best effort —
C code can get past it — which is why the namespace mode is the default whenever the service is
root.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import json
import os
import select
import signal
import sys
import time

import checker

MAX_MESSAGE = checker.MAX_MESSAGE
REAP_S = 0.5  # how long the checker waits for the completion's process to end after EOF
PR_SET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE = 1, 3, 4
_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int = 0) -> int:
    zero = ctypes.c_ulong(0)
    return _libc.prctl(option, ctypes.c_ulong(value), zero, zero, zero)


def _become(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def run(job: dict, wfd: int, uids: tuple[int, int] | None = None, guard: str = "") -> None:
    """Report stages on ``wfd``: syntax, run, one line per test, done (or tamper).

    ``uids``: (checker, completion) to switch to when started as root; ``guard``: the job
    directory, to install the audit-hook guard in the completion's process (guard mode).
    """
    nonce = job.pop("nonce", "")  # lines without it are not ours
    tests = job.pop("tests")
    _prctl(PR_SET_DUMPABLE, 0)  # its /proc entries and memory: out of the completion's reach
    if _prctl(PR_GET_DUMPABLE) != 0:
        raise OSError("cannot make the checker non-dumpable")
    c_in, to_c = os.pipe()  # checker -> completion: the chains to evaluate
    from_c, c_out = os.pipe()  # completion -> checker: stages and plain values
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        del tests, nonce  # nothing of the tests stays reachable in the completion's process
        try:
            for fd in (wfd, to_c, from_c):
                os.close(fd)
            if uids:
                _become(uids[1])
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
            if os.getppid() != parent:
                os._exit(1)
            if guard:
                install_guard(guard)
            _completion(job, checker.Channel(c_in, c_out))
        except BaseException:  # noqa: BLE001 - nothing may escape into the runner's code
            os._exit(70)
        os._exit(0)
    os.close(c_in)
    os.close(c_out)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a dead completion: EPIPE, not our death
    if uids:
        _become(uids[0])
    _Check(job, tests, nonce, wfd, pid, checker.Channel(from_c, to_c)).run()


def _completion(job: dict, chan: checker.Channel) -> None:
    """The completion's process: compile, run setup and code, then answer the checker's chains.
    Nothing here is trusted by the checker; it only keeps honest code working."""
    pid0 = os.getpid()
    encode, decode, compile_, eval_, exec_ = checker.encode, checker.decode, compile, eval, exec

    def reply(**fields) -> None:
        if os.getpid() != pid0:  # a process the completion forked has no say
            os._exit(1)
        chan.send(fields)

    try:
        compiled = compile_(job["code"], "<completion>", "exec")
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, ValueError (NUL bytes), ...
        return reply(stage="syntax", ok=False, error=checker.describe(exc))
    reply(stage="syntax", ok=True)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        if job.get("setup"):
            exec_(compile_(job["setup"], "<setup>", "exec"), namespace)
        exec_(compiled, namespace)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: exiting early is no success
        return reply(stage="run", ok=False, error=checker.describe(exc))
    reply(stage="run", ok=True)
    while (request := chan.recv()) is not None:
        try:
            scope = dict(namespace, **decode(request["bind"])) if request["bind"] else namespace
            value = eval_(compile_(request["expr"], "<test>", "eval"), scope)
            reply(q=request["q"], value=encode(value))  # NotPlainData: not plain, or too large
        except BaseException as exc:  # noqa: BLE001 - the chain's failure is the test's
            reply(q=request["q"], error=checker.describe(exc))


class _Check:
    """The checker: relays the completion's stages, evaluates the tests, owns the report pipe."""

    def __init__(
        self, job: dict, tests: list, nonce: str, wfd: int, pid: int, chan: checker.Channel
    ):
        self.setup, self.tests, self.nonce, self.wfd = job.get("setup") or "", tests, nonce, wfd
        self.pid, self.chan = pid, chan
        self.q = 0
        self.chains: list[str] = []
        self.seen: list[tuple[str, object]] = []
        self.broken: BaseException | None = None  # stays set even if a test's code swallows it

    def emit(self, **fields) -> None:
        data = (json.dumps(dict(fields, n=self.nonce)) + "\n").encode()
        while data:
            data = data[os.write(self.wfd, data) :]

    def run(self) -> None:
        try:
            self._stages()
        except checker.Tamper as exc:
            self.emit(stage="tamper", detail=str(exc)[:MAX_MESSAGE])
        except checker.Gone:
            self._mirror()
        self._reap()

    def _stages(self) -> None:
        namespace = {"__name__": "__main__", "__builtins__": builtins, checker.PROBE: self._probe}
        setup_error = None
        try:  # meanwhile the completion's process compiles and runs the code
            if self.setup:
                exec(compile(self.setup, "<setup>", "exec"), namespace)
        except BaseException as exc:  # noqa: BLE001
            setup_error = checker.describe(exc)
        syntax = self._expect("syntax")
        if not syntax["ok"]:
            return self.emit(stage="syntax", ok=False, error=checker.clean(syntax.get("error")))
        self.emit(stage="syntax", ok=True)
        ran = self._expect("run")
        if not ran["ok"] or setup_error:
            error = setup_error if ran["ok"] else checker.clean(ran.get("error"))
            return self.emit(stage="run", ok=False, error=error)
        self.emit(stage="run", ok=True)
        for index, test in enumerate(self.tests):
            try:
                ok, error = self._test(index, test, namespace)
            except checker.Gone:
                gone = {"type": "ProcessEnded", "message": "the completion's process ended"}
                self.emit(stage="test", index=index, ok=False, error=checker.clean(gone))
                raise
            self.emit(stage="test", index=index, ok=ok, error=error)
        self.emit(stage="done")

    def _expect(self, stage: str) -> dict:
        message = self._recv()
        if (
            message.get("stage") != stage
            or type(message.get("ok")) is not bool
            or not set(message) <= {"stage", "ok", "error"}
        ):
            raise checker.Tamper(f"expected the {stage} report from the completion's process")
        return message

    def _recv(self) -> dict:
        try:
            message = self.chan.recv()
        except OSError as exc:
            raise checker.Gone() from exc
        if message is None:
            raise checker.Gone()
        return message

    def _test(self, index: int, source: str, namespace: dict) -> tuple[bool, dict | None]:
        self.seen = []
        try:
            node = checker.parse_test(source, index)
            planner = checker.Planner(lambda name: name in namespace or name in vars(builtins))
            code = compile(planner.plan(node.test), f"<test {index}>", "eval")
            self.chains = planner.chains
            passed, error = True, None
            if not eval(code, namespace):
                failed = {"type": "AssertionError", "message": checker.show(self.seen)}
                passed, error = False, checker.clean(failed)
        except checker.Remote as exc:
            passed, error = False, exc.error
        except (checker.Tamper, checker.Gone):
            raise
        except BaseException as exc:  # noqa: BLE001 - the test's own failure
            passed, error = False, checker.describe(exc)
        if self.broken is not None:  # the test's code caught it; the channel is still unusable
            raise self.broken
        return passed, error

    def _probe(self, k: int, bound: dict):
        """Called by a planned test: chain ``k``'s value, computed by the completion."""
        if self.broken is not None:
            raise self.broken
        self.q += 1
        chain = self.chains[k]
        request = {"q": self.q, "expr": chain, "bind": checker.encode(bound) if bound else None}
        try:
            try:
                self.chan.send(request)
            except OSError as exc:
                raise checker.Gone() from exc
            reply = self._recv()
            if type(reply.get("q")) is not int or reply["q"] != self.q:
                raise checker.Tamper("an answer to a question the checker did not ask")
            if set(reply) == {"q", "error"}:
                error = checker.clean(reply["error"])
                error["message"] = f"{chain}: {error['message']}"[:MAX_MESSAGE]
                raise checker.Remote(error)
            if set(reply) != {"q", "value"}:
                raise checker.Tamper("an answer that is neither a value nor an error")
            try:
                value = checker.decode(reply["value"])
            except (ValueError, RecursionError) as exc:
                raise checker.Tamper(f"an answer that is not plain data ({exc})") from None
        except (checker.Tamper, checker.Gone) as exc:
            self.broken = exc
            raise
        self.seen.append((chain, value))
        return value

    def _reap(self) -> int | None:
        """Close the channel and collect the completion's process: it ends at end of file. Its
        status, or None if it is still running after ``REAP_S`` (it then dies with us: it has
        PR_SET_PDEATHSIG, and the runner kills every process left with its uid)."""
        os.close(self.chan.wfd)
        try:
            pidfd = os.pidfd_open(self.pid)  # readable once it has ended: no busy polling
        except (AttributeError, OSError):
            pidfd = -1
        try:
            return self._wait(pidfd, time.monotonic() + REAP_S)
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def _wait(self, pidfd: int, deadline: float) -> int | None:
        watch = [self.chan.rfd] + ([pidfd] if pidfd >= 0 else [])  # drain: it never blocks
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self.chan.rfd in select.select(watch, [], [], min(left, 0.002))[0]:
                try:
                    data = os.read(self.chan.rfd, 1 << 16)
                except OSError:
                    data = b""
                if not data:  # end of file stays readable: stop asking
                    watch.remove(self.chan.rfd)
        try:  # possible only on the same uid (guard mode without root)
            os.kill(self.pid, signal.SIGKILL)
            return os.waitpid(self.pid, 0)[1]
        except OSError:
            return None

    def _mirror(self) -> None:
        """End as the completion's process ended, so the runner sees its signal or exit code
        (CPU limit, memory, ``os._exit``); its CPU time is ours once reaped."""
        status = self._reap()
        if status is None:
            self.emit(stage="tamper", detail="the completion's process closed its channel")
            os._exit(0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


# --------------------------------------------------------------------------------------- guard mode

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {
    "os.rename": 2,
    "os.replace": 2,
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.link": 2,
    "os.symlink": 2,
    "os.truncate": 1,
    "os.utime": 1,
    "shutil.rmtree": 1,
    "shutil.move": 2,
    "shutil.copyfile": 2,
}
_DENIED = {
    "os.fork": "creating processes",
    "os.forkpty": "creating processes",
    "os.system": "running programs",
    "os.exec": "running programs",
    "os.posix_spawn": "running programs",
    "os.spawn": "running programs",
    "subprocess.Popen": "running programs",
    "os.startfile": "running programs",
    "ctypes.dlopen": "ctypes",
    "ctypes.dlsym": "ctypes",
    "ctypes.dlsym/handle": "ctypes",
    "ctypes.cdata": "ctypes",
    "os.setuid": "changing identity",
    "os.setgid": "changing identity",
    "os.kill": "signalling processes",
    "os.killpg": "signalling processes",
    "signal.pthread_kill": "signalling processes",
    "os.pidfd_open": "signalling processes",
}


def install_guard(jobdir: str) -> None:
    """Audit hook for guard mode (no namespaces). Must be installed last: it cannot be removed."""
    home = os.path.realpath(jobdir)
    realpath, fsdecode = os.path.realpath, os.fsdecode

    def inside(path) -> bool:
        try:
            resolved = realpath(fsdecode(path))
        except (TypeError, ValueError):
            return False
        return resolved == home or resolved.startswith(home + os.sep) or resolved == "/dev/null"

    def deny(code: int, what: str, path=None):
        raise PermissionError(code, f"sandbox guard: {what} is not allowed", path)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or path is None:
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing and not inside(path):
                deny(errno.EACCES, "writing outside the sandbox directory", str(path))
            text = realpath(fsdecode(path))
            if text.startswith("/proc/") and not text.startswith(f"/proc/{os.getpid()}/"):
                deny(errno.EACCES, "reading other processes' /proc entries", text)
        elif event.startswith("socket."):
            raise OSError(errno.ENETUNREACH, "sandbox guard: network access is disabled")
        elif event in _PATH_EVENTS:
            for path in args[: _PATH_EVENTS[event]]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                    deny(errno.EACCES, f"{event} outside the sandbox directory", str(path))
        elif event in _DENIED:
            if event == "os.kill" and args and args[0] == os.getpid():
                return
            deny(errno.EPERM, _DENIED[event])

    sys.addaudithook(hook)
