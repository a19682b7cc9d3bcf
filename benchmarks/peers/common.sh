# Shared by the peers' build scripts (sourced): Debian packages installed only when missing.
# apt_need PACKAGE... : dpkg names; g++ is checked by its command.
apt_need() {
  local need=() p
  for p in "$@"; do
    if [ "$p" = g++ ]; then command -v g++ >/dev/null 2>&1 || need+=(g++)
    else dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); fi
  done
  [ ${#need[@]} -eq 0 ] && return 0
  echo "[peers] apt-get install ${need[*]}"
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y "${need[@]}"
}
