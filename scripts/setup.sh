#!/usr/bin/env bash
# mrc setup: install system packages, a Python venv with mrc in it, and the
# BPF objects, on a fresh Debian 12 / Debian 13 / Ubuntu 24.04 box.
#
#   sudo scripts/setup.sh             install (idempotent, fast when done)
#   sudo scripts/setup.sh --demo      install, then run `mrcctl demo`
#   sudo scripts/setup.sh --test [PYTEST ARGS...]
#                                     install, then run the test suite
#
# Environment:
#   MRC_VENV        venv location (default: <repo>/.venv, or MRC_VENV=... from
#                   /etc/default/mrc if that file exists)
#   MRC_SETUP_LOG   log file (default: /var/log/mrc-setup.log)
#   MRC_PYTHON      base interpreter (default: /usr/bin/python3, >= 3.11)
#   MRC_SKIP_APT=1  do not touch system packages
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

mode=install
orig_args="$*"
if [[ $# -gt 0 ]]; then
    case "$1" in
        --demo) mode=demo; shift ;;
        --test) mode="test"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "setup.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
fi
if [[ $mode == demo && $# -gt 0 ]]; then
    echo "setup.sh: --demo takes no arguments" >&2; exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
# a machine-wide default (the Vagrant box puts its venv outside the shared folder)
if [[ -z ${MRC_VENV:-} && -r /etc/default/mrc ]]; then
    MRC_VENV=$(sed -n 's/^MRC_VENV=//p' /etc/default/mrc | tail -n 1)
fi
VENV="${MRC_VENV:-$REPO/.venv}"
LOG="${MRC_SETUP_LOG:-/var/log/mrc-setup.log}"
export DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a PIP_DISABLE_PIP_VERSION_CHECK=1
# sudo/CI may hand us a PATH without the sbin directories (ip, tc, nft)
for d in /usr/local/sbin /usr/sbin /sbin; do
    case ":$PATH:" in *":$d:"*) ;; *) PATH="$PATH:$d" ;; esac
done
export PATH

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]]; then
    die "run as root: sudo $0 $orig_args"
fi

mkdir -p "$(dirname "$LOG")"
: >>"$LOG" || die "cannot write log file $LOG"
printf '\n==== %s setup.sh %s (%s)\n' "$(date -Is)" "$mode" "$REPO" >>"$LOG"

step="start"
on_error() {
    local rc=$?
    printf '[setup] FAILED during: %s (exit %s)\n' "$step" "$rc" >&2
    printf '[setup] last lines of %s:\n' "$LOG" >&2
    tail -n 25 "$LOG" | sed 's/^/    /' >&2
    exit "$rc"
}
trap on_error ERR

# run CMD... with output to the log
run() { printf '+ %s\n' "$*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }

# ---------------------------------------------------------------- packages
REQUIRED_PKGS=(
    clang llvm libbpf-dev libbpf1 libc6-dev linux-libc-dev gcc make
    iproute2 nftables iperf3 iputils-ping tcpdump tmux ethtool procps
    python3 python3-venv python3-pip ca-certificates
    openmpi-bin python3-mpi4py python3-numpy  # a real collective client (bench_fabric.py, its test)
)
OPTIONAL_PKGS=(mptcpd mptcpize)

missing_pkgs() {
    local p st
    for p in "$@"; do
        st=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
        [[ $st == ii* ]] || printf '%s\n' "$p"
    done
}

apt_install() {
    run apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "$@"
}

step="system packages"
if [[ ${MRC_SKIP_APT:-0} == 1 ]]; then
    say "system packages: skipped (MRC_SKIP_APT=1)"
elif ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
    die "this script needs a Debian/Ubuntu system (apt-get, dpkg-query)"
else
    mapfile -t missing < <(missing_pkgs "${REQUIRED_PKGS[@]}")
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "system packages: already installed"
    else
        say "system packages: installing ${missing[*]} (log: $LOG)"
        run apt-get -o DPkg::Lock::Timeout=600 update -q
        apt_install "${missing[@]}"
        # optional extras: never fatal
        for p in "${OPTIONAL_PKGS[@]}"; do
            if [[ -n $(missing_pkgs "$p") ]]; then
                apt_install "$p" || say "  optional package $p not available; skipped"
            fi
        done
        # bpftool: a package of its own on Debian; on Ubuntu it lives in linux-tools
        if ! command -v bpftool >/dev/null; then
            apt_install bpftool \
                || apt_install linux-tools-common "linux-tools-$(uname -r)" \
                || say "  bpftool not available for this kernel; skipped (optional)"
        fi
    fi
fi
for c in clang ip tc nft; do
    command -v "$c" >/dev/null || die "'$c' is missing after the package step"
done
[[ -e /usr/include/bpf/bpf_helpers.h ]] || die "libbpf headers missing (/usr/include/bpf); install libbpf-dev"
# The cache listing goes to a variable first: under pipefail, `ldconfig -p |
# grep -q` fails whenever grep exits on its first match while ldconfig (a
# listing over the 64 KiB pipe buffer on a full image) is still writing.
ld_cache=$( { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null || true)
if [[ $ld_cache != *'libbpf.so.1 '* ]] && ! compgen -G '/usr/lib/*/libbpf.so.1' >/dev/null \
        && ! compgen -G '/lib/*/libbpf.so.1' >/dev/null; then
    die "libbpf.so.1 not found by the dynamic linker; install libbpf1"
fi

# ------------------------------------------------------------------ python
step="python venv"
PY="${MRC_PYTHON:-}"
if [[ -z $PY ]]; then
    if [[ -x /usr/bin/python3 ]]; then PY=/usr/bin/python3; else PY=$(command -v python3 || true); fi
fi
[[ -n $PY && -x $PY ]] || die "no python3 found (install python3 >= 3.11)"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    die "$PY is Python $("$PY" -c 'import platform; print(platform.python_version())'); mrc needs >= 3.11"
fi
[[ -f pyproject.toml ]] || die "pyproject.toml not found in $REPO"

if [[ -d $VENV ]] && ! "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; then
    say "venv: $VENV is broken or too old; recreating"
    rm -rf "$VENV"
fi
if [[ ! -x $VENV/bin/python ]]; then
    say "venv: creating $VENV with $PY"
    run "$PY" -m venv "$VENV" || die "python3 -m venv failed (is python3-venv installed?)"
fi

step="pip install"
MARKER="$VENV/.mrc-installed"
if [[ -f $MARKER && $MARKER -nt pyproject.toml && -x $VENV/bin/mrcctl ]] \
    && "$VENV/bin/python" -c 'import mrcctl, pytest' >/dev/null 2>&1; then
    say "python packages: up to date"
else
    say "python packages: pip install -e '.[test]'"
    run "$VENV/bin/python" -m pip install -q -e '.[test]'
    touch "$MARKER"
fi

# --------------------------------------------------------------------- bpf
step="BPF objects (make -C bpf)"
[[ -f bpf/Makefile ]] || die "bpf/Makefile not found"
run make -C bpf
objs=(bpf/*.o)
say "bpf objects: ${objs[*]}"

step="mrcctl link"
if [[ -x $VENV/bin/mrcctl ]]; then
    ln -sfn "$VENV/bin/mrcctl" /usr/local/bin/mrcctl
    say "mrcctl: /usr/local/bin/mrcctl -> $VENV/bin/mrcctl"
else
    die "$VENV/bin/mrcctl missing after pip install"
fi

trap - ERR
say "done"

# --------------------------------------------------------------- next step
case $mode in
    demo)
        say "running: mrcctl demo"
        exec "$VENV/bin/mrcctl" demo
        ;;
    test)
        [[ -d tests ]] || die "no tests/ directory"
        if [[ $# -eq 0 ]]; then set -- tests; fi
        say "running: pytest $*"
        set +e
        "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=10 "$@"
        rc=$?
        set -e
        if [[ $rc -eq 5 ]]; then
            die "pytest collected no tests (exit 5)"
        fi
        exit "$rc"
        ;;
esac
