"""Namespace isolation of the sandbox fork-server (runner.py): fresh mount, network and pid
namespaces, a read-only filesystem, a size-limited tmpfs for job directories and a read-only
view of the standard library inside it. Standard library only; loaded by file path beside
runner.py, never as a package import."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = (
    442,
    -100,
    0x8000,
    1,
    2,
)
STDLIB = os.path.dirname(os.__file__)

libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(
        libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {target}",
    )


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _readonly_everything() -> None:
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    if (
        libc.syscall(
            SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
        )
        == 0
    ):
        return
    with open("/proc/self/mountinfo") as f:  # older kernels: remount each mount point
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    for point in sorted(set(points), key=len):
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        except OSError as exc:
            print(f"sandbox: cannot make {point} read-only: {exc}", file=sys.stderr)


def enter_namespaces(root: str, disk_mb: int) -> str:
    """Become pid 1 of fresh mount/net/pid namespaces with a read-only filesystem and a tmpfs at
    ``root``."""
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
    child = os.fork()
    if child:  # the outer process only relays the exit status
        os.close(0)
        os.close(1)
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0x7F)
    libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _readonly_everything()
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=0711")
    # The interpreter may live where a job's uid cannot reach (e.g. under /root): show jobs the
    # standard library read-only inside the tmpfs, and point their sys.path there.
    target = os.path.join(root, "pylib")
    os.mkdir(target, 0o755)
    _mount(STDLIB, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    return target
