"""Sandbox fork-server: ``python3 -I -S runner.py``, talking JSON lines on stdin/stdout.

First line in: the settings (root dir, limits, concurrency, isolation, uid base). Then one job per
line: ``{"id", "code", "setup", "tests"}``; one answer per line comes back, in completion order:
``{"id", "exit", "signal", "wall_s", "cpu_s", "killed", "lines"}`` where ``lines`` are the harness
reports. The service decides what they mean (services/reward/functions/code_reward.py).

Isolation "namespaces" (root): the server unshares mount, network and pid namespaces and becomes
pid 1 of the new pid namespace; the whole filesystem is remounted read-only, a size-limited tmpfs
holds the job directories, a fresh /proc shows only sandbox processes, the network has only a down
loopback.
Each job runs in a forked child: own session/process group, rlimits (CPU, address space, file size,
processes, open files, no core), no_new_privs, an empty environment, cwd = a private 0700 directory.
The child splits into the checker and the completion's process (harness.py), each with its own
uid/gid from a block of unused ids (job uid, job uid + concurrency), so the process limit counts
only that job and neither our processes nor the checker can be signalled or read by the completion.
After a job, every process left with either uid is killed.
Isolation "guard" (not root): rlimits, process group and an audit-hook guard on the completion's
process (see harness.py).
Standard library only; nothing of the service (and none of its environment) is loaded here.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import select
import shutil
import signal
import sys
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (harness.py beside this file, not a package import)
from namespaces import PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, enter_namespaces  # noqa: E402

MAX_REPORT_BYTES = 256 * 1024
SWEEP_WAIT_S = 2.0  # how long a sweep waits for SIGKILLed processes to leave the process table
STDLIB = os.path.dirname(os.__file__)
# Imported once here so jobs need not import them again (forked children share these pages).
PRELOAD = (
    "math",
    "re",
    "itertools",
    "functools",
    "collections",
    "heapq",
    "bisect",
    "string",
    "typing",
    "random",
    "fractions",
    "decimal",
    "copy",
    "operator",
    "dataclasses",
    "statistics",
    "socket",
    "encodings.idna",
)
JOB_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

libc = ctypes.CDLL(None, use_errno=True)


class Job:
    def __init__(self, req: dict, uid: int, path: str):
        self.req, self.uid, self.path = req, uid, path
        self.pid = self.rfd = -1
        self.buf = bytearray()
        self.start = time.monotonic()
        self.killed = ""
        self.eof = False  # the report pipe is closed (the job may still run)
        self.nonce = ""


class Runner:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.namespaces = cfg["isolation"] == "namespaces"
        here = os.path.dirname(os.path.abspath(__file__))
        stdlib_view = cfg.get("stdlib_view") or STDLIB
        self.job_path = [p.replace(STDLIB, stdlib_view, 1) for p in sys.path if p != here]
        self.drop = os.geteuid() == 0
        if not self.namespaces:
            os.chmod(cfg["root"], 0o711)  # job uids must reach their own directory
        self.free_uids = deque(cfg["uid_base"] + i for i in range(cfg["concurrency"]))
        self.queue: deque[dict] = deque()
        self.running: dict[int, Job] = {}
        self.inbuf = bytearray()
        self.eof = False
        self.counter = 0
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    # ------------------------------------------------------------------ main loop
    def serve(self) -> None:
        while not (self.eof and not self.running):
            self._start_jobs()
            deadlines = [
                j.start + self.cfg["wall_s"] for j in self.running.values() if not j.killed
            ]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 1.0
            fds = (
                [self.wake_r]
                + ([] if self.eof else [0])
                + [j.rfd for j in self.running.values() if not j.eof]
            )
            try:
                ready, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                ready = []
            for fd in ready:
                if fd == self.wake_r:
                    os.read(self.wake_r, 4096)
                elif fd == 0:
                    self._read_requests()
                else:
                    self._read_report(fd)
            self._enforce_deadlines()
            self._reap()
        for job in list(self.running.values()):  # stdin closed: the service is gone
            self._kill(job, "shutdown")

    def _read_requests(self) -> None:
        data = os.read(0, 1 << 20)
        if not data:
            self.eof = True
            self.queue.clear()
            return
        self.inbuf += data
        *lines, rest = self.inbuf.split(b"\n")
        self.inbuf = bytearray(rest)
        for line in lines:
            if line.strip():
                self.queue.append(json.loads(line))

    def _read_report(self, fd: int) -> None:
        job = next((j for j in self.running.values() if j.rfd == fd), None)
        if job is None:
            return
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            job.eof = True
        elif len(job.buf) < MAX_REPORT_BYTES:
            job.buf += data[: MAX_REPORT_BYTES - len(job.buf)]

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for job in self.running.values():
            if not job.killed and now - job.start > self.cfg["wall_s"]:
                self._kill(job, "wall")

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.running.pop(pid, None)
            if job is not None:  # other pids: orphans of a job, reparented to us (pid 1)
                self._finish(job, status, usage)

    # ------------------------------------------------------------------ jobs
    def _start_jobs(self) -> None:
        while self.queue and self.free_uids:
            req = self.queue.popleft()
            uid = self.free_uids.popleft()
            self.counter += 1
            job = Job(req, uid, os.path.join(self.cfg["root"], f"job{self.counter}"))
            job.nonce = req["nonce"] = os.urandom(16).hex()
            os.mkdir(job.path, 0o700)
            if self.drop:  # the completion's uid; the checker needs nothing of the directory
                os.chown(job.path, uid + self.cfg["concurrency"], uid + self.cfg["concurrency"])
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:
                self._child(job, rfd, wfd)
            os.close(wfd)
            os.set_blocking(rfd, False)
            job.pid, job.rfd = pid, rfd
            self.running[pid] = job

    def _child(self, job: Job, rfd: int, wfd: int) -> None:
        """In the forked job process: lock down, then run the harness. Never returns."""
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(
                signal.SIGXFSZ, signal.SIG_IGN
            )  # oversized writes fail with EFBIG instead
            os.setsid()
            null = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, wfd)
            os.closerange(wfd + 1, 65536)
            self.queue.clear()  # other jobs' tests are none of its business
            self.running.clear()
            self.inbuf[:] = bytes(len(self.inbuf))  # may hold part of the next job (its tests)
            self.inbuf.clear()
            job.nonce = ""  # only the harness keeps it
            os.chdir(job.path)
            cfg = self.cfg
            cpu = max(1, math.ceil(cfg["cpu_s"]))
            for limit, value in (
                (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                (resource.RLIMIT_AS, (cfg["memory_mb"] << 20,) * 2),
                (resource.RLIMIT_FSIZE, (cfg["file_size_mb"] << 20,) * 2),
                (resource.RLIMIT_NOFILE, (cfg["nofile"],) * 2),
                (resource.RLIMIT_CORE, (0, 0)),
            ):
                resource.setrlimit(limit, value)
            if self.drop:
                resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"],) * 2)
            libc.prctl(
                PR_SET_NO_NEW_PRIVS,
                ctypes.c_ulong(1),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
            )
            libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))
            sys.path[:] = self.job_path
            view = self.cfg.get("stdlib_view")
            for module in (
                list(sys.modules.values()) if view else ()
            ):  # packages keep their own search path
                search = getattr(module, "__path__", None)
                if isinstance(search, list):
                    search[:] = [p.replace(STDLIB, view, 1) for p in search]
            os.environ.clear()
            os.environ.update(JOB_ENV, HOME=job.path, TMPDIR=job.path)
            os.umask(0o077)
            # Two processes, each on its own uid when root: the checker and the completion.
            uids = (job.uid, job.uid + cfg["concurrency"]) if self.drop else None
            harness.run(job.req, wfd, uids, "" if self.namespaces else job.path)
        except BaseException:  # noqa: BLE001 - nothing may escape into the server's loop
            os._exit(70)
        os._exit(0)

    def _kill(self, job: Job, why: str) -> None:
        job.killed = job.killed or why
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except OSError:
            pass
        self._sweep(job.uid)

    def _sweep(self, uid: int) -> None:
        """Kill every process still running as the job's uids (checker, completion and whatever
        the completion forked or daemonised)."""
        for each in (uid, uid + self.cfg["concurrency"]) if self.drop else ():
            self._sweep_uid(each)

    def _sweep_uid(self, uid: int) -> None:
        # A SIGKILLed process stays listed until the kernel has run its exit, which on a loaded
        # machine can take longer than twenty back-to-back checks: wait, bounded, with a pause.
        deadline, pause = time.monotonic() + SWEEP_WAIT_S, 0.002
        while True:
            if not self.namespaces or self._has_processes(uid):
                helper = os.fork()
                if helper == 0:  # kill(-1) as that uid reaches exactly its processes, atomically
                    try:
                        os.setresuid(uid, uid, uid)
                        os.kill(-1, signal.SIGKILL)
                    finally:
                        os._exit(0)
                os.waitpid(helper, 0)
            if not self.namespaces or not self._has_processes(uid):
                return
            if time.monotonic() > deadline:  # unkillable (D state): the next job's sweep retries
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _has_processes(self, uid: int) -> bool:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.stat(f"/proc/{name}").st_uid == uid:
                        with open(f"/proc/{name}/stat", "rb") as f:
                            if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                                return True
                except (OSError, IndexError):
                    continue
        return False

    def _finish(self, job: Job, status: int, usage) -> None:
        wall = time.monotonic() - job.start
        self._sweep(job.uid)
        while True:  # whatever the job wrote before it ended
            try:
                data = os.read(job.rfd, 65536)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            if len(job.buf) < MAX_REPORT_BYTES:
                job.buf += data[: MAX_REPORT_BYTES - len(job.buf)]
        os.close(job.rfd)
        shutil.rmtree(job.path, ignore_errors=True)
        self.free_uids.append(job.uid)
        lines = []
        for raw in bytes(job.buf).splitlines()[:1000]:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and line.pop("n", None) == job.nonce:
                lines.append(line)
        job.req.pop("nonce", None)
        answer = {
            "id": job.req.get("id"),
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "maxrss_kb": usage.ru_maxrss,
            "killed": job.killed,
            "lines": lines,
        }
        _write(json.dumps(answer))


def _write(line: str) -> None:
    data = (line + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def main() -> None:
    first = bytearray()
    while not first.endswith(
        b"\n"
    ):  # byte by byte: nothing after the settings may be buffered away
        byte = os.read(0, 1)
        if not byte:
            return
        first += byte
    cfg = json.loads(first)
    isolation = cfg["isolation"]
    if isolation in ("auto", "namespaces"):
        try:
            if os.geteuid() != 0:
                raise PermissionError("namespace isolation needs root")
            cfg["stdlib_view"] = enter_namespaces(cfg["root"], cfg["disk_mb"])
            isolation = "namespaces"
        except OSError as exc:
            if isolation == "namespaces":
                _write(json.dumps({"fatal": f"cannot isolate with namespaces: {exc}"}))
                return
            isolation = "guard"
    cfg["isolation"] = isolation
    for name in PRELOAD:
        __import__(name)
    runner = Runner(cfg)
    _write(
        json.dumps(
            {"ready": True, "isolation": isolation, "pid": os.getpid(), "root": os.geteuid() == 0}
        )
    )
    runner.serve()


if __name__ == "__main__":
    main()
