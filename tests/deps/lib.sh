# shellcheck shell=bash
# Sourced by tests/setup and the scripts beside it: what they share. Needs ROOT (the
# checkout); sets CACHE (its .cache) unless set.
#
#   install_debian_packages PKG...   apt-get install those of PKG not installed yet
#   debian13_source PACKAGE DIR [OPT...]
#                                    Debian 13's (trixie) source package PACKAGE,
#                                    downloaded into DIR and unpacked into DIR/src
#                                    (dpkg-source -x with OPT, e.g. --skip-patches);
#                                    prints its version; fails (says why) when apt
#                                    cannot download it
#   timed NAME COMMAND...            runs COMMAND; says how long it took

CACHE=${CACHE:-$ROOT/.cache}

say() { echo "${SAY_AS:-setup}: $*" >&2; }
die() { echo "${SAY_AS:-setup}: ERROR: $*" >&2; exit 1; }

install_debian_packages() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q >&2 ||
    die "apt-get update failed; check the network or the apt sources, then run tests/setup again"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >&2 ||
    die "apt-get install failed for: ${missing[*]}"
}

# apt reads a private sources list holding one deb-src line and keeps its lists under
# .cache/apt-trixie: the system's apt configuration and state are left alone, and no
# Debian 13 binary package can reach the machine this way (apt-get source only
# downloads). Needs dpkg-dev (dpkg-source) and debian-archive-keyring.
debian13_source() {
  local package=$1 dir=$2 apt_dir=$CACHE/apt-trixie suite=trixie dsc version
  shift 2
  local apt=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/sources"
             -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
  rm -rf "$dir"
  mkdir -p "$apt_dir/sources" "$apt_dir/lists/partial" "$apt_dir/cache" "$dir"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
    >"$apt_dir/sources/$suite-src.list"
  # The lists are fetched when there are none, and again when a download fails: a point
  # release may have replaced the version they name.
  if ! { { ls "$apt_dir"/lists/*_Sources* >/dev/null 2>&1 || "${apt[@]}" update; } &&
         (cd "$dir" && "${apt[@]}" source --download-only "$package"); } >"$dir/apt.log" 2>&1 &&
     ! { "${apt[@]}" update && (cd "$dir" && "${apt[@]}" source --download-only "$package"); } >>"$dir/apt.log" 2>&1; then
    grep '^E:' "$dir/apt.log" | head -5 >&2
    say "could not download Debian $suite's $package source (log: $dir/apt.log)"
    return 1
  fi
  local found=("$dir"/*.dsc)
  dsc=${found[0]}
  version=$(basename "$dsc" .dsc) && version=${version#*_}
  dpkg-source -x "$@" "$dsc" "$dir/src" >>"$dir/apt.log" 2>&1 ||
    { tail -20 "$dir/apt.log" >&2; say "could not unpack $dsc (log: $dir/apt.log)"; return 1; }
  echo "$version"
}

timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  say "$name took $((SECONDS - start)) s"
}
