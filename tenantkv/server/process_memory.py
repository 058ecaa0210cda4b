"""How a serving process asks the C allocator to hand large buffers back.

glibc's malloc serves a request above its mmap threshold with a mapping of its
own, given back to the kernel when freed. The threshold is dynamic: each time
such a mapping is freed it rises to that size (up to 32 MiB), so after the
first 20 MiB value is freed every later one comes from the heap, and a heap
does not shrink while anything above the freed space lives. Measured: 32
connections pipelining 20 MiB writes left the server 1.6 GB resident after
they were all answered; with a fixed threshold, 68 MB. Setting the threshold
fixes it (glibc stops adjusting it), so buffers of values, frames and replies
over :data:`MMAP_THRESHOLD_BYTES` are returned when freed. So is scrypt's
16 MiB buffer, one per password hash: each hashing thread's arena kept one,
and 600 logins on a few threads kept +225 MiB.

Elsewhere than glibc (musl, macOS) this does nothing: their allocators return
large blocks already, or are not what Linux servers run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("tenantkv.server")

#: Allocations at least this large get a mapping of their own, returned when
#: freed. 1 MiB: requests' usual buffers (a 256 KiB receive, replies of small
#: values) stay on the heap, where allocating costs no system call.
MMAP_THRESHOLD_BYTES = 1024 * 1024
#: mallopt's parameter number for the threshold (glibc's malloc.h).
M_MMAP_THRESHOLD = -3


def return_large_allocations(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix the allocator's mmap threshold at ``threshold`` bytes; False where the
    C library has no ``mallopt`` (not glibc) or refuses."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
    return ok
