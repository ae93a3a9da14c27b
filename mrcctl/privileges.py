"""Capability checks, so a missing privilege is one clear line, not a traceback."""

from __future__ import annotations

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


def effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def missing(need_bpf: bool = True, need_net: bool = True) -> list[str]:
    """Names of the capabilities this process lacks for the requested work.

    CAP_SYS_ADMIN implies CAP_BPF on every kernel that has CAP_BPF.
    """
    caps = effective_caps()
    have = lambda c: bool(caps >> c & 1)  # noqa: E731
    out = []
    if need_bpf and not (have(CAP_BPF) or have(CAP_SYS_ADMIN)):
        out.append("CAP_BPF")
    if need_net and not have(CAP_NET_ADMIN):
        out.append("CAP_NET_ADMIN")
    if need_bpf and not have(CAP_SYS_ADMIN):
        # Mounting the bpffs and joining the host mount namespace need it.
        out.append("CAP_SYS_ADMIN")
    return out
