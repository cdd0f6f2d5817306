#!/usr/bin/env bash
# Makes (once) the virtual environment of the S3-compatible server the tests start on loopback
# (moto in server mode, from PyPI), and prints its bin directory (moto_server, python).
#
#   scripts/s3-venv.sh                 build/s3-venv
#   RINGMASTER_S3_VENV=DIR             somewhere else
#
# moto is not in Debian 12. The tests run `moto_server -H 127.0.0.1 -p PORT` from here and talk to
# it with boto3 (Debian's python3-boto3 for /usr/bin/python3; the MXNet environment has its own).
# A second run costs nothing. Needs PyPI (or a mirror through pip's own configuration).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${RINGMASTER_S3_VENV:-$root/build/s3-venv}
requirements=("moto[server]==5.0.28" "boto3<1.36")
stamp="$venv/.ringmaster-requirements"
have_all() {
  [[ -x $venv/bin/moto_server && -f $stamp ]] || return 1
  local r
  for r in "${requirements[@]}"; do grep -qxF -- "$r" "$stamp" || return 1; done
}
if ! have_all; then
  [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    "${requirements[@]}" >&2
  "$venv/bin/python" -c "import moto, boto3" >&2
  printf '%s\n' "${requirements[@]}" | sort -u > "$stamp"
fi
echo "$venv/bin"
