#!/usr/bin/env bash
# make-certs.sh DIR: a private CA and one certificate for the NATS nodes of
# deploy/compose, for clients and routes alike (names nats-1, nats-2,
# nats-3, localhost, 127.0.0.1; server and client authentication), with
# openssl. Writes DIR/ca.pem, DIR/server.pem and DIR/server-key.pem (0600),
# and keeps existing files (remove them to renew). host-setup.sh runs it.
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR}
install -d -m 0755 "$dir"
cd "$dir"
if [[ -s ca.pem && -s server.pem && -s server-key.pem ]]; then
	echo "make-certs: $dir has certificates; keeping them" >&2
	exit 0
fi
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
	-subj "/CN=jetcrew compose CA" -keyout ca-key.pem -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
	-subj "/CN=nats" -keyout server-key.pem -out server.csr 2>/dev/null
cat >server.ext <<'EXT'
subjectAltName = DNS:nats-1, DNS:nats-2, DNS:nats-3, DNS:localhost, IP:127.0.0.1
extendedKeyUsage = serverAuth, clientAuth
keyUsage = digitalSignature
EXT
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial \
	-days 825 -extfile server.ext -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl
chmod 0644 ca.pem server.pem
chmod 0600 server-key.pem ca-key.pem
echo "make-certs: wrote $dir/ca.pem, server.pem, server-key.pem" >&2
