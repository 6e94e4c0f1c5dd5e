# Installs Debian packages the scripts need, as CI's clean machine lacks them. Sourced; not a
# command.

# apt_install PACKAGE...: installs them with apt (updating the lists only if the first try fails),
# or fails naming them when this is not root on a host with apt.
apt_install() {
    (($#)) || return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        printf 'needed: %s (Debian: apt-get install %s)\n' "$*" "$*" >&2
        return 1
    fi
    printf 'installing %s with apt\n' "$*" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 ||
        { apt-get update -qq >&2 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2; }
}
