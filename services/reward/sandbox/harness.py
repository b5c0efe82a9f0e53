"""Runs inside a sandboxed job process: compile the completion, run it, run each test, report as
JSON lines.

Standard library only (loaded by runner.py under ``python -I -S``). Also holds the guard used
when kernel isolation is unavailable: an audit hook that refuses network, writes outside the job
directory, other processes' /proc, signals, ctypes and starting programs. The guard is best effort —
C code can get past it — which is why the namespace mode is the default whenever the service is
root.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import sys

MAX_MESSAGE = 300


def describe(exc: BaseException) -> dict:
    """A short, JSON-safe account of an exception (the exception object itself is untrusted)."""
    out = {"type": "BaseException", "errno": None, "message": "", "filename": None}
    try:
        out["type"] = type(exc).__name__[:80]
        err = getattr(exc, "errno", None)
        out["errno"] = err if isinstance(err, int) else None
        fname = getattr(exc, "filename", None)
        out["filename"] = str(fname)[:200] if isinstance(fname, (str, bytes)) else None
        out["message"] = str(exc)[:MAX_MESSAGE]
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not break reporting
        pass
    return out


def run(job: dict, wfd: int) -> None:
    """Report stages on ``wfd``: syntax, run, one line per test, done. Forked descendants never
    report."""
    pid0 = os.getpid()
    nonce = job.pop(
        "nonce", ""
    )  # lines without it are not ours (forging needs the interpreter's memory)

    def emit(**fields) -> None:
        if os.getpid() != pid0:  # a process the completion forked: it has no say in the result
            os._exit(1)
        data = (json.dumps(dict(fields, n=nonce)) + "\n").encode()
        while data:
            data = data[os.write(wfd, data) :]

    try:
        compiled = compile(job["code"], "<completion>", "exec")
    except BaseException as exc:  # noqa: BLE001 - SyntaxError, ValueError (NUL bytes), RecursionError, ...
        emit(stage="syntax", ok=False, error=describe(exc))
        return
    emit(stage="syntax", ok=True)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        if job.get("setup"):
            exec(compile(job["setup"], "<setup>", "exec"), namespace)
        exec(compiled, namespace)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: exiting early must not look like success
        emit(stage="run", ok=False, error=describe(exc))
        return
    emit(stage="run", ok=True)
    for index, test in enumerate(job["tests"]):
        try:
            exec(compile(test, f"<test {index}>", "exec"), namespace)
            ok, error = True, None
        except BaseException as exc:  # noqa: BLE001
            ok, error = False, describe(exc)
        emit(stage="test", index=index, ok=ok, error=error)
    emit(stage="done")


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
