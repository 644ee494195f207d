"""Named POSIX shared-memory segments for KV that a same-node peer reads directly.

A prefill worker whose exports may be pulled over the same-node path keeps the host-visible
bytes of its KV in a :class:`SharedSegment` under ``/dev/shm``: the export's handle names it and a
decode process on the same node maps it read-only (:func:`open_segment_readonly`) and copies
blocks out, with no socket in between. Names are random under one prefix; the creator unlinks
its segment when it closes — explicitly (the engine's close, on a replica's stop), or when the
segment object is collected or the interpreter exits without that close (a finalizer) — and
should it die first, Python's resource tracker unlinks it. A
segment's pages are allocated when it is made (a tmpfs that fills up later, e.g. with Ray's
object store, would otherwise fault the KV on first touch); one that does not fit is refused.

A process killed together with its resource tracker (Ray stopping a worker's process group, the
OOM killer) leaves its segments behind, and ``/dev/shm`` is RAM. So a name also carries its
creator's pid and pid namespace (``pdserve-kv-<ns>-<pid>-<random>``), and every new segment
first removes the names of creators in its own pid namespace that no longer run
(:func:`sweep_orphans`); a name from another namespace is never touched.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import weakref
from multiprocessing import resource_tracker

from core.errors import ConfigError

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
NAME_PREFIX = "pdserve-kv-"
_NAME = re.compile(r"^pdserve-kv-(?:(\d+)-(\d+)-)?[0-9a-f]{24}$")


class SharedSegment:
    """One named segment of ``nbytes`` this process created (and unlinks)."""

    def __init__(self, nbytes: int) -> None:
        """Raises ``ConfigError`` when ``/dev/shm`` is missing or lacks room for ``nbytes``."""
        sweep_orphans()  # first: what dead processes left counts as room
        try:
            stats = os.statvfs(SHM_DIR)
        except OSError as e:
            raise ConfigError(f"no POSIX shared memory at {SHM_DIR}: {e}") from e
        free_bytes = stats.f_bavail * stats.f_frsize
        if free_bytes < nbytes:
            raise ConfigError(
                f"{SHM_DIR} has {free_bytes} bytes free, the KV needs {nbytes}",
                param="transfer.same_node",
            )
        self.name = f"{NAME_PREFIX}{_pid_namespace()}-{os.getpid()}-{secrets.token_hex(12)}"
        path = os.path.join(SHM_DIR, self.name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            os.posix_fallocate(fd, 0, nbytes)
            self._map = mmap.mmap(fd, nbytes)
        except OSError as e:
            os.unlink(path)
            raise ConfigError(
                f"{SHM_DIR} could not hold {nbytes} bytes of KV: {e}", param="transfer.same_node"
            ) from e
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        # NOTE: the resource tracker unlinks the name should this process die before unlink()
        resource_tracker.register(f"/{self.name}", "shared_memory")
        self.nbytes = nbytes
        self._unlinked = False
        # NOTE: holds the name only, never self; runs on collection and at interpreter exit
        self._finalizer = weakref.finalize(self, _unlink_name, self.name)

    @property
    def buf(self) -> memoryview:
        """The segment's bytes (writable; the mapping lives as long as a view of it)."""
        return memoryview(self._map)

    def unlink(self) -> None:
        """Remove the name; every mapping (ours, peers') stays valid until dropped. Idempotent."""
        if not self._unlinked:
            self._unlinked = True
            self._finalizer()


def _unlink_name(name: str) -> None:
    """Remove a segment this process created, and stop tracking it."""
    resource_tracker.unregister(f"/{name}", "shared_memory")
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        logger.debug("shared KV segment %s was already gone", name)


def open_segment_readonly(name: str) -> mmap.mmap:
    """Map another process's segment read-only. Raises ``OSError`` when it is gone, ``ValueError``
    for a name that is not one of ours."""
    return _open_segment(name, writable=False)


def open_segment_writable(name: str) -> mmap.mmap:
    """Map another process's segment read-write (a tensor-parallel follower's KV, which rank 0
    fills on import); errors as :func:`open_segment_readonly`."""
    return _open_segment(name, writable=True)


def _open_segment(name: str, *, writable: bool) -> mmap.mmap:
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a pdserve KV segment name")
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR if writable else os.O_RDONLY)
    try:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, os.fstat(fd).st_size, prot=prot)
    finally:
        os.close(fd)


def _pid_namespace() -> int:
    """The inode of this process's pid namespace (0 when it cannot be read)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def sweep_orphans(*, expected: bool = False) -> list[str]:
    """Unlink the segments whose creator, in this pid namespace, no longer runs; their names.
    ``expected``: the caller knows their creators just stopped (logged as info, not a warning)."""
    namespace = _pid_namespace()
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        if match is None or match.group(1) is None or not namespace:
            continue
        if int(match.group(1)) != namespace or _running(int(match.group(2))):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            continue  # another process swept it first
    if removed:
        log = logger.info if expected else logger.warning
        log("removed %d shared KV segments left by dead processes", len(removed))
    return removed
