"""The sandbox of a runner (Linux namespaces, rlimits, an unprivileged uid) and the judge's handle on it."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .channel import _MAX_MESSAGE, _pack, _unpack
from .checks import DEFAULT_TIME_LIMIT

# ----------------------------------------------------------------------------- the sandbox (Linux)
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
_PR_SET_PDEATHSIG = 1


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _ok(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()       # noqa: E731
    _ok(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _traversable(libc, paths: list[str]) -> None:
    """Let an unprivileged uid reach ``paths`` through directories closed to others (e.g. /root, mode 700).

    Each closed directory on the way gets a tmpfs on top holding only bind mounts of the children
    on those paths (in this mount namespace only).
    """
    blocked: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(os.path.realpath(path)).parts
        for i in range(1, len(parts)):
            directory = str(Path(*parts[:i]))
            with contextlib.suppress(OSError):
                if not os.stat(directory).st_mode & stat.S_IXOTH:
                    blocked.setdefault(directory, set()).add(parts[i])
    for directory in sorted(blocked, key=lambda d: len(Path(d).parts)):
        _tmpfs_keeping(libc, directory, blocked[directory], "size=64k,mode=0755")


def _tmpfs_keeping(libc, directory: str, children, options: str) -> None:
    """Cover ``directory`` with a fresh tmpfs that shows only the named ``children`` (bind mounts of the originals)."""
    fds = {c: os.open(os.path.join(directory, c), os.O_PATH) for c in children
           if os.path.exists(os.path.join(directory, c))}
    _mount(libc, "tmpfs", directory, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    for child, fd in fds.items():
        target = os.path.join(directory, child)
        if stat.S_ISDIR(os.stat(f"/proc/self/fd/{fd}").st_mode):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(libc, f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        os.close(fd)


def _private_tmpfs(libc, target: str, options: str, needed: list[str]) -> None:
    """A fresh tmpfs on ``target`` (e.g. /tmp) that still shows the ``needed`` paths under it (a venv in /tmp)."""
    target = os.path.realpath(target)
    keep = {Path(os.path.realpath(p)).relative_to(target).parts[0] for p in needed
            if os.path.realpath(p).startswith(target + os.sep)}
    _tmpfs_keeping(libc, target, keep, options)


def _user_processes(uid: int) -> int:
    """Threads (RLIMIT_NPROC counts threads) of all processes of ``uid``."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


def _sandbox(config: dict) -> None:
    """Confine this process before any student code runs (see `Limits` and the module docstring)."""
    import resource

    limits, mode = config["limits"], config["isolation"]
    scratch = config["scratch"]
    if mode in ("root", "userns"):
        libc = _libc()
        uid, gid = os.getuid(), os.getgid()
        nproc_base = 0 if mode == "root" else _user_processes(uid)
        flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | (_CLONE_NEWUSER if mode == "userns" else 0)
        _ok(libc.unshare(flags), "unshare")
        if mode == "userns":
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
            Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
        if mode == "root":
            _traversable(libc, config["needed"])
        size = f"size={limits['file_bytes'] * 4},mode=1777"
        for tmp in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(tmp):
                _private_tmpfs(libc, tmp, size, config["needed"])
        for hidden in config["hide"]:
            if os.path.isdir(hidden):
                _mount(libc, "tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4k,mode=0700")
            elif os.path.exists(hidden):
                _mount(libc, "/dev/null", hidden, None, _MS_BIND)
        scratch = "/tmp/submission"
        os.mkdir(scratch, 0o700)
        if mode == "root":
            os.chown(scratch, config["uid"], config["uid"])
        pid = os.fork()
        if pid:                                   # stay as the namespace's parent until its init ends
            for fd in (0, 1, 2, config["reply_fd"]):
                with contextlib.suppress(OSError):
                    os.close(fd)
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        _ok(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    else:
        nproc_base = _user_processes(os.getuid())
    for which, value in ((resource.RLIMIT_AS, limits["memory_bytes"]), (resource.RLIMIT_FSIZE, limits["file_bytes"]),
                         (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, nproc_base + limits["processes"])):
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))
    if mode == "root":
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
        _ok(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch, MPLCONFIGDIR=scratch)


# ----------------------------------------------------------------------------- the judge's side of the runner
@dataclass(frozen=True)
class Limits:
    """What one submission may use. The runner and every process it starts share the process count.

    ``memory_bytes``, ``cpu_seconds`` and ``file_bytes`` hold per process (RLIMIT_AS, RLIMIT_CPU,
    RLIMIT_FSIZE; with namespaces the private /tmp holds 4 x ``file_bytes``); ``processes`` is
    RLIMIT_NPROC (threads count too); ``wall_seconds`` bounds the whole submission, after which
    everything it started is killed; ``cell_seconds`` and ``call_seconds`` stop one notebook cell
    and one call of the student's code in a check.
    """

    memory_bytes: int = 2 * 2 ** 30
    cpu_seconds: int = 240
    processes: int = 16
    file_bytes: int = 64 * 2 ** 20
    open_files: int = 256
    wall_seconds: float = 300.0
    cell_seconds: float = 60.0
    call_seconds: float = DEFAULT_TIME_LIMIT


def _can_unshare(flags: int) -> bool:
    probe = f"import ctypes, sys; sys.exit(0 if ctypes.CDLL(None).unshare({flags}) == 0 else 1)"
    return subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True).returncode == 0


def isolation_available() -> str:
    """``root`` (namespaces and an unprivileged uid), ``userns`` (unprivileged namespaces) or ``basic``.

    Root in a container without CAP_SYS_ADMIN (Docker's default) cannot make namespaces: ``basic``.
    """
    if not sys.platform.startswith("linux"):
        return "basic"
    if os.geteuid() == 0 and _can_unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID):
        return "root"
    if _can_unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID):
        return "userns"
    return "basic"


def _needed_paths() -> list[str]:
    import xfam_lib

    paths = [sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, sys.exec_prefix,
             str(Path(xfam_lib.__file__).resolve().parent), str(Path(torch.__file__).resolve().parent),
             *_import_paths()]
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    return list(dict.fromkeys(paths))


# The runner imports the judge's own xfam_grading and xfam_lib (the paths in its config), not whatever
# the interpreter would find first.
_RUNNER_MAIN = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1])['path']; "
                "from xfam_grading.runner import _runner_main; _runner_main()")


def _import_paths() -> list[str]:
    """The folders holding the judge's ``xfam_grading`` and ``xfam_lib`` packages."""
    import xfam_lib

    here = Path(__file__).resolve().parent.parent
    return list(dict.fromkeys([str(here), str(Path(xfam_lib.__file__).resolve().parent.parent)]))


class _Runner:
    """One runner process, seen from the judge: send the request, read frames until done, kill everything."""

    def __init__(self, request: dict, limits: Limits, isolation: str, uid: int, hide: list[str]):
        self.limits, self.isolation = limits, isolation
        self.tail = b""
        self.scratch = tempfile.TemporaryDirectory(prefix="xfam_runner_")
        read_fd, write_fd = os.pipe()
        config = {"reply_fd": write_fd, "isolation": isolation, "uid": uid, "hide": hide,
                  "limits": dataclasses.asdict(limits), "needed": _needed_paths(), "scratch": self.scratch.name,
                  "path": _import_paths()}
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        if isolation == "basic":
            os.chmod(self.scratch.name, 0o700)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-u", "-c", _RUNNER_MAIN, json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
            start_new_session=True, cwd=self.scratch.name, env=env)
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "rb", buffering=0)
        threading.Thread(target=self._write, args=(_pack(request),), daemon=True).start()
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _write(self, payload: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(payload)
            self.proc.stdin.close()

    def _drain(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: self.proc.stdout.read(4096), b""):
                self.tail = (self.tail + chunk)[-4000:]

    def _read(self, n: int, deadline: float) -> bytes | None:
        """``n`` bytes from the reply pipe; None at its end or once the runner has exited and nothing is left."""
        data = b""
        while len(data) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.replies], [], [], min(remaining, 0.5))
            if not ready:
                if self.proc.poll() is not None and not select.select([self.replies], [], [], 0.1)[0]:
                    return None
                continue
            chunk = os.read(self.replies.fileno(), min(n - len(data), 1 << 20))
            if not chunk:
                return None
            data += chunk
        return data

    def messages(self):
        """Yield the runner's messages; stops at the end, at an unreadable frame, or raises TimeoutError."""
        deadline = time.monotonic() + self.limits.wall_seconds
        while True:
            head = self._read(8, deadline)
            if head is None:
                return
            (size,) = struct.unpack(">Q", head)
            if size > _MAX_MESSAGE:
                raise ValueError(f"a message of {size} bytes from the runner (more than {_MAX_MESSAGE})")
            data = self._read(size, deadline)
            if data is None:
                return
            message = _unpack(data)
            if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
                raise ValueError("an unreadable message from the runner")
            yield message
            if message["kind"] == "done":
                return

    def close(self) -> None:
        """Kill the runner and everything it started (its process group; with namespaces, its PID namespace)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self.drain.join(timeout=5)
        for stream in (self.replies, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(OSError):
            self.scratch.cleanup()


