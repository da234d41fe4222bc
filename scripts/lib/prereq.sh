# Sourced by the scripts: installs what a bare machine lacks (Debian's
# packages, as root), or stops with a message that names the package.
#
#   need CMD PACKAGE...    CMD missing: apt-get install PACKAGE... (root) or die
#   need_python_venv       python3 with venv and pip (python3, python3-venv, python3-pip)
#   need_rust_components   rustfmt and clippy (rustup component add)

prereq_log() { printf '%s: %s\n' "${PREREQ_NAME:-prereq}" "$*" >&2; }
prereq_die() { printf '%s: error: %s\n' "${PREREQ_NAME:-prereq}" "$*" >&2; exit 1; }

# Installs Debian packages as root; otherwise says which and stops.
apt_install() { # $@ = packages
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        prereq_die "missing: $* (install as root with: apt-get install -y $*)"
    fi
    prereq_log "installing $* with apt-get (once)"
    local log
    log="$(mktemp)"
    # Slim Debian images lack man dirs, which breaks some packages' scripts.
    mkdir -p /usr/share/man/man1
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2 || true
        rm -f "$log"
        prereq_die "apt-get install $* failed"
    fi
    rm -f "$log"
}

need() { # $1 = command, rest = packages that provide it
    local cmd="$1"
    shift
    command -v "$cmd" >/dev/null 2>&1 && return 0
    apt_install "$@"
    command -v "$cmd" >/dev/null 2>&1 || prereq_die "installed $* but \`$cmd\` is still missing"
}

need_python_venv() {
    need python3 python3
    # Debian splits venv and ensurepip out of python3.
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        apt_install python3-venv python3-pip
    fi
}

need_rust_components() {
    local missing=()
    cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
    cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
    (( ${#missing[@]} == 0 )) && return 0
    command -v rustup >/dev/null 2>&1 \
        || prereq_die "cargo ${missing[*]} is missing and there is no rustup to add it; install the ${missing[*]} component(s) of your toolchain"
    prereq_log "adding the ${missing[*]} component(s) with rustup (once)"
    rustup component add "${missing[@]}" >&2 || prereq_die "rustup component add ${missing[*]} failed"
}
