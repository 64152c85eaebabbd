"""The sandbox's syscall filter: a classic-BPF seccomp program (bubblewrap's ``--seccomp FD``) that
refuses the syscalls that would let a program hold memory outside its limits, reach kernel
surfaces a Python program has no use for, or open a socket of any family but ``AF_UNIX``; every
other syscall is allowed.

=====================================  ========  ======================================================
refused                                errno     why
=====================================  ========  ======================================================
``memfd_create``, ``memfd_secret``     EPERM     anonymous files live in host memory outside ``RLIMIT_AS``
``shmget``, ``msgget``                 EPERM     SysV shared memory and message queues outlive their mapping
``unshare``, ``setns``, ``mount``,     EPERM     new namespaces and mounts (a nested user namespace could
``umount2``, ``pivot_root``, the new             mount a tmpfs of half the host's RAM); bubblewrap's
mount API (``open_tree`` ...)                    ``--disable-userns`` also forbids nested user namespaces
``keyctl``, ``add_key``,               EPERM     kernel keyrings (shared with the user outside the box)
``request_key``
``bpf``, ``perf_event_open``,          EPERM     kernel attack surface
``userfaultfd``, ``io_uring_setup``,
``kexec_load``, ``init_module``,
``finit_module``
``ptrace``, ``process_vm_readv``,      EPERM     reading or steering other processes
``process_vm_writev``
the 12 xattr calls (``setxattr``,      ENOTSUP   extended attributes are unreclaimable kernel memory that
``lsetxattr``, ``fsetxattr``,                    no size limit of ``/tmp`` counts (a flood took 1.4-1.7 GiB
``getxattr`` ... ``fremovexattr``)               in 5 s); ENOTSUP is what a filesystem without xattrs
and ``setxattrat`` ... ``removexattrat``         answers, which ``shutil.copy2`` ignores
``socket``, ``socketpair`` with a      EAFNO-    no connection leaves the box by any address family
family other than ``AF_UNIX`` (1)      SUPPORT   (``AF_INET``, ``AF_INET6``, ``AF_VSOCK`` to the hypervisor,
                                                 ``AF_NETLINK``, ``AF_PACKET``...); ``AF_UNIX`` stays:
                                                 ``asyncio`` and ``multiprocessing`` make socket pairs, and
                                                 the box's filesystem and network namespace hold no host
                                                 socket, abstract ones included. EAFNOSUPPORT is what a
                                                 kernel without the family answers
any other ABI (i386, x32)              EPERM     the numbers above are the native ABI's; a program could call
                                                 the same syscalls through another ABI's numbers (i386's
                                                 ``socketcall`` multiplexer included)
=====================================  ========  ======================================================

The family is the low 32 bits of the first argument (``seccomp_data.args[0]``), the ``int`` the
kernel reads. :func:`program` returns the filter for this machine's architecture (x86_64, aarch64)
or None elsewhere (the sandbox then runs without a filter; ``check_sandbox`` says so). Source: the
kernel's seccomp filter ABI (``Documentation/userspace-api/seccomp_filter.rst``, ``struct
seccomp_data``) and its syscall tables (``arch/x86/entry/syscalls/syscall_64.tbl``,
``include/uapi/asm-generic/unistd.h``; the ``*xattrat`` calls are Linux 6.13's 463-466 on every
architecture).
"""

from __future__ import annotations

import errno
import platform
import socket
import struct

# struct sock_filter: u16 code, u8 jt, u8 jf, u32 k
_LD_ABS_W, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | errno
_X32_BIT = 0x40000000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]'s low word on a little-endian machine)

DENIED = ("memfd_create", "memfd_secret", "shmget", "msgget", "unshare", "setns", "mount", "umount2", "pivot_root",
          "open_tree", "move_mount", "fsopen", "fsmount", "keyctl", "add_key", "request_key", "bpf",
          "perf_event_open", "userfaultfd", "io_uring_setup", "kexec_load", "init_module", "finit_module", "ptrace",
          "process_vm_readv", "process_vm_writev")
XATTR = ("setxattr", "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr",
         "flistxattr", "removexattr", "lremovexattr", "fremovexattr", "setxattrat", "getxattrat", "listxattrat",
         "removexattrat")
SOCKETS = ("socket", "socketpair")
#: the one address family a program may open: local socket pairs (asyncio, multiprocessing)
ALLOWED_FAMILY = socket.AF_UNIX
_XATTRAT = {"setxattrat": 463, "getxattrat": 464, "listxattrat": 465, "removexattrat": 466}
#: (AUDIT_ARCH_*, {syscall: number}) per machine
ARCHES = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68, "unshare": 272,
                            "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428,
                            "move_mount": 429, "fsopen": 430, "fsmount": 432, "keyctl": 250, "add_key": 248,
                            "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                            "io_uring_setup": 425, "kexec_load": 246, "init_module": 175, "finit_module": 313,
                            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
                            **dict(zip(XATTR, range(188, 200))), **_XATTRAT, "socket": 41, "socketpair": 53}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186, "unshare": 97,
                             "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428,
                             "move_mount": 429, "fsopen": 430, "fsmount": 432, "keyctl": 219, "add_key": 217,
                             "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
                             "io_uring_setup": 425, "kexec_load": 104, "init_module": 105, "finit_module": 273,
                             "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
                             **dict(zip(XATTR, range(5, 17))), **_XATTRAT, "socket": 198, "socketpair": 199}),
}


def _assemble(prog: list[tuple]) -> bytes:
    """``struct sock_filter`` bytes of ``prog``: ``(code, k, jt, jf)`` rows whose jump targets are
    label names, and ``("label", name)`` rows that mark where a label points (they emit nothing)."""
    where, n = {}, 0
    for row in prog:
        if row[0] == "label":
            where[row[1]] = n
        else:
            n += 1
    out, i = [], 0
    for row in prog:
        if row[0] == "label":
            continue
        code, k, jt, jf = row
        jt, jf = (where[t] - i - 1 if isinstance(t, str) else t for t in (jt, jf))
        out.append(struct.pack("=HBBI", code, jt, jf, k))
        i += 1
    return b"".join(out)


def program(machine: str | None = None) -> bytes | None:
    """The compiled filter (``struct sock_filter`` array) for ``machine`` (default: this one), or
    None for an architecture without a table here."""
    machine = machine or platform.machine()
    arch = ARCHES.get(machine)
    if arch is None:
        return None
    audit, numbers = arch
    prog = [(_LD_ABS_W, _ARCH, 0, 0), (_JEQ, audit, 1, 0), (_RET, _ERRNO | errno.EPERM, 0, 0),  # another ABI
            (_LD_ABS_W, _NR, 0, 0)]
    if machine == "x86_64":
        prog.append((_JGE, _X32_BIT, "eperm", 0))
    prog += [(_JEQ, numbers[name], "eperm", 0) for name in DENIED]
    prog += [(_JEQ, numbers[name], "enotsup", 0) for name in XATTR]
    prog += [(_JEQ, numbers[name], "family", 0) for name in SOCKETS]
    prog += [(_RET, _ALLOW, 0, 0),
             ("label", "family"), (_LD_ABS_W, _ARG0, 0, 0), (_JEQ, ALLOWED_FAMILY, "allow", 0),
             (_RET, _ERRNO | errno.EAFNOSUPPORT, 0, 0),
             ("label", "allow"), (_RET, _ALLOW, 0, 0),
             ("label", "enotsup"), (_RET, _ERRNO | errno.ENOTSUP, 0, 0),
             ("label", "eperm"), (_RET, _ERRNO | errno.EPERM, 0, 0)]
    return _assemble(prog)
