"""The sandbox's syscall filter: a classic-BPF seccomp program (bubblewrap's ``--seccomp FD``) that
answers ``EPERM`` to the few syscalls that would let a program hold memory outside its limits or
reach kernel surfaces a Python program has no use for; every other syscall is allowed.

=====================================  ===============================================================
denied                                 why
=====================================  ===============================================================
``memfd_create``, ``memfd_secret``     anonymous files live in host memory outside ``RLIMIT_AS``
``shmget``, ``msgget``                 SysV shared memory and message queues outlive their mapping
``unshare``, ``setns``, ``mount``,     new namespaces and mounts (a nested user namespace could mount a
``umount2``, ``pivot_root``, the new   tmpfs of half the host's RAM); bubblewrap's ``--disable-userns``
mount API (``open_tree`` ...)          also forbids nested user namespaces
``keyctl``, ``add_key``,               kernel keyrings (shared with the user outside the box)
``request_key``
``bpf``, ``perf_event_open``,          kernel attack surface
``userfaultfd``, ``io_uring_setup``,
``kexec_load``, ``init_module``,
``finit_module``
``ptrace``, ``process_vm_readv``,      reading or steering other processes
``process_vm_writev``
any other ABI (i386, x32)              the numbers above are the native ABI's; a program could call
                                       the same syscalls through another ABI's numbers
=====================================  ===============================================================

:func:`program` returns the filter for this machine's architecture (x86_64, aarch64) or None
elsewhere (the sandbox then runs without a filter; :func:`policyzoo.plugins.env.sandbox.run_python`
says so in its result's ``notes``). Source: the kernel's seccomp filter ABI
(``Documentation/userspace-api/seccomp_filter.rst``, ``struct seccomp_data``) and its syscall tables
(``arch/x86/entry/syscalls/syscall_64.tbl``, ``include/uapi/asm-generic/unistd.h``).
"""

from __future__ import annotations

import errno
import platform
import struct

# struct sock_filter: u16 code, u8 jt, u8 jf, u32 k
_LD_ABS_W, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _DENY = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
_X32_BIT = 0x40000000

DENIED = ("memfd_create", "memfd_secret", "shmget", "msgget", "unshare", "setns", "mount", "umount2", "pivot_root",
          "open_tree", "move_mount", "fsopen", "fsmount", "keyctl", "add_key", "request_key", "bpf",
          "perf_event_open", "userfaultfd", "io_uring_setup", "kexec_load", "init_module", "finit_module", "ptrace",
          "process_vm_readv", "process_vm_writev")
#: (AUDIT_ARCH_*, {syscall: number}) per machine
ARCHES = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68, "unshare": 272,
                            "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428,
                            "move_mount": 429, "fsopen": 430, "fsmount": 432, "keyctl": 250, "add_key": 248,
                            "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                            "io_uring_setup": 425, "kexec_load": 246, "init_module": 175, "finit_module": 313,
                            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186, "unshare": 97,
                             "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428,
                             "move_mount": 429, "fsopen": 430, "fsmount": 432, "keyctl": 219, "add_key": 217,
                             "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
                             "io_uring_setup": 425, "kexec_load": 104, "init_module": 105, "finit_module": 273,
                             "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271}),
}


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple:
    return (code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The compiled filter (``struct sock_filter`` array) for ``machine`` (default: this one), or
    None for an architecture without a table here."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit, numbers = arch
    checks = [numbers[name] for name in DENIED]
    body = [_ins(_LD_ABS_W, 0)]  # seccomp_data.nr
    if (machine or platform.machine()) == "x86_64":
        body.append(("x32", _X32_BIT))
    body += [("nr", n) for n in checks]
    prog = [_ins(_LD_ABS_W, 4), ("arch", audit), _ins(_RET, _DENY)]  # seccomp_data.arch: another ABI is denied
    prog += body + [_ins(_RET, _ALLOW), _ins(_RET, _DENY)]
    deny = len(prog) - 1
    out = []
    for i, ins in enumerate(prog):
        if ins[0] == "arch":  # equal: skip the deny right after
            ins = _ins(_JEQ, ins[1], jt=1)
        elif ins[0] == "x32":
            ins = _ins(_JGE, ins[1], jt=deny - i - 1)
        elif ins[0] == "nr":
            ins = _ins(_JEQ, ins[1], jt=deny - i - 1)
        out.append(struct.pack("=HBBI", *ins))
    return b"".join(out)
