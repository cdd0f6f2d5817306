#!/usr/bin/env bash
# Makes a certificate authority and the certificates a first Ringmaster deployment (and the tests)
# need, with openssl. Each pair is written the way a Kubernetes TLS secret (and cert-manager) lays
# it out: DIR/NAME/tls.crt, DIR/NAME/tls.key and DIR/NAME/ca.crt.
#
#   dev-ca.sh DIR [--san SAN]... [--days N]
#       DIR/ca.crt, DIR/ca.key                  the CA (kept: a second run reuses it)
#       DIR/coordinator/  CN=ringmaster-coordinator; SANs DNS:localhost, IP:127.0.0.1, IP:::1,
#                         DNS:ringmaster-coordinator, DNS:ringmaster-coordinator.ringmaster.svc,
#                         DNS:ringmaster-coordinator.ringmaster.svc.cluster.local, and each --san
#                         (e.g. --san IP:10.0.0.5 --san DNS:coordinator.example.com)
#       DIR/worker/       CN=ringmaster-worker, O=ringmaster:workers (every worker daemon)
#       DIR/user/         CN=user (a user who owns the jobs it submits)
#       DIR/admin/        CN=admin, O=ringmaster:admins (acts on every job)
#   dev-ca.sh DIR --issue NAME --cn CN [--group G]... [--san SAN]... [--days N]
#       one more pair, DIR/NAME/, signed by DIR's CA (e.g. a worker per host: --cn host-a
#       --group ringmaster:workers)
#
# For tests and a first deployment: production certificates come from your own CA or cert-manager.
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
(($# >= 1)) || usage
dir=$1
shift
days=365
issue=""
cn=""
groups=()
sans=()
while (($#)); do
  case $1 in
    --san) sans+=("$2"); shift 2 ;;
    --days) days=$2; shift 2 ;;
    --issue) issue=$2; shift 2 ;;
    --cn) cn=$2; shift 2 ;;
    --group) groups+=("$2"); shift 2 ;;
    -h | --help) usage ;;
    *) echo "dev-ca.sh: unknown option '$1'" >&2; usage ;;
  esac
done
command -v openssl >/dev/null || { echo "dev-ca.sh: openssl is not installed" >&2; exit 1; }
mkdir -p "$dir"
umask 077

if [[ ! -f $dir/ca.key ]]; then
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" -days "$days" -subj "/CN=ringmaster-dev-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
fi

# make_pair NAME CN "GROUP..." "SAN..."  (SANs comma-separated, as openssl takes them)
make_pair() {
  local name=$1 common=$2 orgs=$3 alt=$4 out="$dir/$1" subject
  mkdir -p "$out"
  subject="/CN=$common"
  for g in $orgs; do subject+="/O=$g"; done
  local ext
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -n $alt ]] && echo "subjectAltName=$alt"
  } >"$ext"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$out/tls.key" -out "$out/tls.csr" -subj "$subject" 2>/dev/null
  openssl x509 -req -in "$out/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -out "$out/tls.crt" -days "$days" -extfile "$ext" 2>/dev/null
  rm -f "$out/tls.csr" "$ext"
  cp "$dir/ca.crt" "$out/ca.crt"
  chmod 600 "$out/tls.key"
  chmod 644 "$out/tls.crt" "$out/ca.crt"
}

join_sans() { local IFS=,; echo "$*"; }

if [[ -n $issue ]]; then
  [[ -n $cn ]] || { echo "dev-ca.sh: --issue needs --cn" >&2; exit 2; }
  make_pair "$issue" "$cn" "${groups[*]:-}" "$(join_sans "${sans[@]:-}")"
  echo "dev-ca.sh: $dir/$issue/tls.crt (CN=$cn${groups:+ O=${groups[*]}})"
  exit 0
fi

coordinator_sans=(DNS:localhost IP:127.0.0.1 IP:::1 DNS:ringmaster-coordinator
  DNS:ringmaster-coordinator.ringmaster.svc DNS:ringmaster-coordinator.ringmaster.svc.cluster.local)
coordinator_sans+=("${sans[@]}")
make_pair coordinator ringmaster-coordinator "" "$(join_sans "${coordinator_sans[@]}")"
make_pair worker ringmaster-worker "ringmaster:workers" ""
make_pair user user "" ""
make_pair admin admin "ringmaster:admins" ""
chmod 644 "$dir/ca.crt"
echo "dev-ca.sh: CA $dir/ca.crt; pairs in $dir/{coordinator,worker,user,admin}/"
