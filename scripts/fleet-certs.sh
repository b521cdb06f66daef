#!/usr/bin/env bash
# Makes the certificates for a small Tunefleet fleet with mutual TLS:
#   scripts/fleet-certs.sh DIR BROKER_HOST [CLIENT_NAME...]
# DIR/ca.pem + ca.key        the fleet's certificate authority (keep ca.key offline)
# DIR/broker.pem + .key      the broker's certificate, for BROKER_HOST, localhost and 127.0.0.1
# DIR/NAME.pem + NAME.key    one client certificate per agent (and one for the coordinator)
# Client certificates carry a common name and no organisation: rumqttd would
# read an organisation as a tenant and put that client in a namespace of its own.
set -euo pipefail
dir=${1:?usage: fleet-certs.sh DIR BROKER_HOST [CLIENT_NAME...]}
host=${2:?usage: fleet-certs.sh DIR BROKER_HOST [CLIENT_NAME...]}
shift 2
mkdir -p "$dir"
cd "$dir"
days=825
if [ ! -f ca.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
    -days "$days" -subj "/CN=tunefleet fleet CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
issue() { # name subject-alt-names extended-key-usage
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" -days "$days" \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=critical,CA:FALSE\n' "$2" "$3") 2>/dev/null
  rm -f "$1.csr"
  chmod 600 "$1.key"
}
case "$host" in
  *[!0-9.]*) san="DNS:$host,DNS:localhost,IP:127.0.0.1" ;;
  *) san="IP:$host,DNS:localhost,IP:127.0.0.1" ;;
esac
issue broker "$san" serverAuth
for name in "$@"; do
  issue "$name" "DNS:$name" clientAuth
done
echo "certificates in $(pwd): ca.pem broker.pem $(printf '%s.pem ' "$@")"
