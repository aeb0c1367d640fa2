"""The sandbox of a runner (Linux namespaces, rlimits, an unprivileged uid) and the judge's handle on it."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path


from .channel import _MAX_MESSAGE, _MAX_TOTAL, _pack, _unpack
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


_MS_RDONLY, _MS_NOEXEC, _MS_REMOUNT = 0x1, 0x8, 0x20
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 0x400, 0x800, 0x200000
_NOBODY = 65534                   # the uid the submission sees inside a nested user namespace
_DEVICES = ("null", "zero", "full", "random", "urandom")


def _kept_flags(path: str) -> int:
    """The flags of the mount holding ``path`` that a remount must keep (a user namespace locks them)."""
    st = os.statvfs(path).f_flag
    pairs = ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
             (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME), (os.ST_RELATIME, _MS_RELATIME))
    return _MS_NOSUID | _MS_NODEV | sum(ms for st_flag, ms in pairs if st & st_flag)


def _mountpoint(source: str, target: str) -> None:
    """An empty directory or file at ``target`` (parents made as needed) to mount ``source`` on."""
    if os.path.lexists(target):
        return
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if os.path.isdir(source):
        os.mkdir(target, 0o755)
    else:
        open(target, "w").close()


def _bind(libc, source: str, root: str, *, writable: bool = False) -> None:
    """Bind ``source`` at the same path inside ``root``, read-only unless ``writable``; a symlink is copied."""
    target = root + source
    if os.path.islink(source):
        if not os.path.lexists(target):
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            os.symlink(os.readlink(source), target)
        return
    if not os.path.exists(source):
        return
    _mountpoint(source, target)
    _mount(libc, source, target, None, _MS_BIND | _MS_REC)
    if not writable:
        _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _kept_flags(source))


def _build_root(libc, root: str, config: dict) -> None:
    """A new root file system on ``root``, made from an allowlist (``config["binds"]``, see `_root_plan`).

    A tmpfs holds only: read-only binds of the Python installation, of the site-packages entries
    of the distributions a submission may use (each site-packages folder is a tmpfs of its own, so
    nothing else installed there shows), of xfam_lib and xfam_grading, and of the system's shared
    libraries; a few device nodes; an empty private /tmp and /dev/shm, the only writable places.
    The repository, its .git, the submissions folder, the tests and the home directories are not
    there at all.
    """
    limits = config["limits"]
    _mount(libc, "tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    # the private /tmp and /dev/shm first: a checkout or a virtual environment that lives under /tmp
    # is then bound on top of the private /tmp, not hidden below it
    size = f"size={limits['file_bytes'] * 4},mode=1777"
    for tmp in ("/tmp", "/dev/shm"):
        os.makedirs(root + tmp, mode=0o755, exist_ok=True)
        _mount(libc, "tmpfs", root + tmp, "tmpfs", _MS_NOSUID | _MS_NODEV, size)
    plan = config["binds"]
    for path in plan["system"] + plan["python"]:
        _bind(libc, path, root)
    for folder, entries in plan["site"].items():
        os.makedirs(root + folder, mode=0o755, exist_ok=True)
        _mount(libc, "tmpfs", root + folder, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
        for entry in entries:
            _bind(libc, os.path.join(folder, entry), root)
    for path in plan["packages"]:                      # after the site folders: they may be inside one
        _bind(libc, path, root)
    for path in plan["covered"]:                       # e.g. the base Python's own site-packages
        if os.path.isdir(root + path):
            _mount(libc, "tmpfs", root + path, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4k,mode=0755")
    for device in _DEVICES:
        _bind(libc, f"/dev/{device}", root, writable=True)
    os.makedirs(root + "/proc", mode=0o555, exist_ok=True)
    for path in [root, *(root + folder for folder in plan["site"]), *(root + p for p in plan["covered"])]:
        if os.path.ismount(path):                      # the folders made here are read-only too
            _mount(libc, None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _user_processes(uid: int) -> int:
    """Threads (RLIMIT_NPROC counts threads) of all processes of ``uid``."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_MNT_DETACH = 2


def _pivot_root(libc, root: str) -> None:
    """Make ``root`` this mount namespace's root and detach the old one: nothing else is reachable."""
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: no system call number for {os.uname().machine}")
    os.chdir(root)
    _ok(libc.syscall(number, b".", b"."), "pivot_root")
    _ok(libc.umount2(b".", _MNT_DETACH), "umount the old root")
    os.chdir("/")


def _lock_mounts(libc, uid: int, gid: int) -> None:
    """In a user namespace: enter a nested one, where the mounts made above are locked (they cannot be
    unmounted or made writable) and this process holds no capability over them."""
    _ok(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{_NOBODY} 0 1")
    Path("/proc/self/gid_map").write_text(f"{_NOBODY} 0 1")


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
        root = config["scratch"]                          # the judge's empty folder becomes the new root
        _build_root(libc, root, config)
        scratch = "/tmp/submission"
        os.mkdir(root + scratch, 0o700)
        if mode == "root":
            os.chown(root + scratch, config["uid"], config["uid"])
        pid = os.fork()
        if pid:                                   # stay as the namespace's parent until its init ends
            for fd in (0, 1, 2, config["reply_fd"]):
                with contextlib.suppress(OSError):
                    os.close(fd)
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        _ok(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
        # PID 1 of the new PID namespace: a fresh /proc shows only the submission's processes
        _mount(libc, "proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        _pivot_root(libc, root)
        if mode == "userns":
            _lock_mounts(libc, uid, gid)
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
    and one call of the student's code in a check; ``score_seconds`` bounds the judge's comparison of
    one submission's outputs (whose size the judge bounds as it reads them, `channel.message_problem`).
    """

    memory_bytes: int = 2 * 2 ** 30
    cpu_seconds: int = 240
    processes: int = 16
    file_bytes: int = 64 * 2 ** 20
    open_files: int = 256
    wall_seconds: float = 300.0
    cell_seconds: float = 60.0
    call_seconds: float = DEFAULT_TIME_LIMIT
    score_seconds: float = 60.0


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


# What a runner's file system holds besides the Python installation and the two packages: the
# distributions xfam_lib depends on, with theirs (what the autograder zip installs for submissions),
# and the system's shared libraries.
_RUNTIME = ("torch", "numpy", "matplotlib", "tqdm", "ipywidgets", "gymnasium", "triton")
_SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
           "/etc/ld.so.conf.d", "/etc/fonts")


@functools.lru_cache(maxsize=None)
def _site_entries() -> dict[str, list[str]]:
    """site-packages folder -> its entries (packages, modules, metadata) of `_RUNTIME` and their requirements."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo, seen, out = list(_RUNTIME), set(), {}
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        folder = os.path.realpath(dist.locate_file(""))
        for file in dist.files or []:
            top = file.parts[0]
            if top not in ("..", "__pycache__") and os.path.lexists(os.path.join(folder, top)):
                out.setdefault(folder, set()).add(top)
    return {folder: sorted(entries) for folder, entries in out.items()}


def _root_plan(hide: list[str]) -> dict:
    """What `_build_root` binds: ``system``, ``python``, ``packages`` (xfam_lib, xfam_grading), ``site``
    (site-packages folder -> allowed entries) and ``covered`` (the base Python's site-packages)."""
    import sysconfig

    import xfam_lib

    site = _site_entries()
    packages = [str(Path(xfam_lib.__file__).resolve().parent), str(Path(__file__).resolve().parent)]
    python = [os.path.realpath(p) for p in (sys.base_prefix, os.path.join(sys.prefix, "pyvenv.cfg"),
                                            os.path.join(sys.prefix, "bin"))]
    base_site = os.path.realpath(sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
                                 ["purelib"])
    plan = {"system": list(_SYSTEM), "python": list(dict.fromkeys(python)), "packages": packages, "site": site,
            "covered": [base_site] if base_site not in site else []}
    shown = plan["python"] + packages + [os.path.join(f, e) for f, entries in site.items() for e in entries]
    for hidden in map(os.path.realpath, hide):     # a bound folder must not hold a hidden path
        clash = [p for p in shown if hidden == p or hidden.startswith(p + os.sep)]
        if clash:
            raise RuntimeError(f"the runner's file system would show {hidden}, which must stay hidden, "
                               f"through {clash[0]}")
    return plan


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
        config = {"reply_fd": write_fd, "isolation": isolation, "uid": uid, "limits": dataclasses.asdict(limits),
                  "scratch": self.scratch.name, "path": _import_paths(),
                  "binds": _root_plan(hide) if isolation != "basic" else {}}
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
               # Triton kernels (ch03 q6b) run in Triton's CPU interpreter, which is switched on
               # before anything imports triton: the runner grades on the CPU, like the judge
               "TRITON_INTERPRET": "1"}
        if isolation == "basic":
            os.chmod(self.scratch.name, 0o700)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-u", "-c", _RUNNER_MAIN, json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
            start_new_session=True, cwd=self.scratch.name, env=env)
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "rb", buffering=0)
        self.outbox: queue.Queue = queue.Queue()
        self.outbox.put(_pack(request))
        threading.Thread(target=self._write, daemon=True).start()
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _write(self) -> None:
        """Write the request, then every frame `send` queues, on the runner's stdin (never blocking the judge)."""
        with contextlib.suppress(OSError, ValueError):
            for payload in iter(self.outbox.get, None):
                self.proc.stdin.write(payload)
                self.proc.stdin.flush()
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def send(self, message: dict) -> None:
        """Queue one more frame for the runner (after the request): a part's reference answer."""
        self.outbox.put(_pack(message))

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
        total = 0
        while True:
            head = self._read(8, deadline)
            if head is None:
                return
            (size,) = struct.unpack(">Q", head)
            total += size
            if size > _MAX_MESSAGE or total > _MAX_TOTAL:
                raise ValueError(f"a message of {size} bytes from the runner (at most {_MAX_MESSAGE} each, "
                                 f"{_MAX_TOTAL} in all)")
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
        self.outbox.put(None)
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


