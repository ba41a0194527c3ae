#!/usr/bin/env bash
# Ensures cabine's local dependencies: installs redis-server, postgresql,
# nats-server, curl, openssl (the simulator's `--tls` RSA server key),
# prometheus (its `promtool` checks a live pod's /metrics in the tests),
# chromium and tmux (the status page and `cabine status` tests), buildah and podman
# (the container image tests) from Debian packages and kubernetes-validate (pip,
# pinned; the manifest tests) when missing, starts the three services on loopback when
# nothing listens on their ports, and makes Postgres accept root@127.0.0.1/test.
# Idempotent: on a machine where all three already run it only checks.
set -euo pipefail

say() { printf '[deps] %s\n' "$*" >&2; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 1 100); do listening "$1" && return 0; sleep 0.1; done
  say "nothing listens on 127.0.0.1:$1 after starting $2"; return 1
}

need_cmd() { command -v "$1" >/dev/null 2>&1; }
# Debian packages without their recommends; the package lists fetched when absent or stale.
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
}

missing=()
need_cmd curl || missing+=(curl)
need_cmd openssl || missing+=(openssl)
need_cmd redis-server || missing+=(redis-server)
{ need_cmd psql && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; } || missing+=(postgresql)
{ need_cmd nats-server || [ -x /usr/sbin/nats-server ]; } || missing+=(nats-server)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# promtool (package prometheus) for the /metrics test; the Prometheus server it
# ships is not wanted: policy-rc.d keeps the package from starting it.
if ! need_cmd promtool; then
  say "installing prometheus (for promtool; its server is not started)"
  policy=/usr/sbin/policy-rc.d
  had_policy=0; [ -e "$policy" ] && had_policy=1
  [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; }
  apt_install prometheus
  [ "$had_policy" = 1 ] || rm -f "$policy"
fi

# chromium (headless: the status page's browser test) and tmux (`cabine status --watch` under a terminal).
ui=()
need_cmd chromium || ui+=(chromium)
need_cmd tmux || ui+=(tmux)
if [ ${#ui[@]} -gt 0 ]; then
  say "installing ${ui[*]} (apt-get; the status page and terminal tests)"
  apt_install "${ui[@]}"
fi

# buildah and podman (the image tests build an image with buildah, registry-free; containers
# cannot run on these machines, so the tests chroot into the image's root filesystem) and the
# pinned kubernetes-validate (PyPI) for the manifests. kubectl renders ops/k8s (`kubectl
# kustomize`): the machine image carries it; it is not a Debian package.
images=()
need_cmd buildah || images+=(buildah)
need_cmd podman || images+=(podman)
need_cmd unshare || images+=(util-linux)
if [ ${#images[@]} -gt 0 ]; then
  say "installing ${images[*]} (apt-get; the container image tests)"
  apt_install "${images[@]}"
fi
KUBERNETES_VALIDATE=1.37.0
if [ "$(kubernetes-validate --version 2>/dev/null)" != "$KUBERNETES_VALIDATE" ]; then
  say "installing kubernetes-validate $KUBERNETES_VALIDATE (pip; the manifest tests)"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "kubernetes-validate==$KUBERNETES_VALIDATE"
fi
need_cmd kubectl || say "kubectl is missing: the manifest tests render ops/k8s with 'kubectl kustomize'"

if ! need_cmd cargo; then
  say "cargo is missing: install a Rust toolchain (https://rustup.rs), then run this again"
  exit 1
fi

# Redis: no persistence, loopback only.
if ! listening 6379; then
  say "starting redis-server on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/cabine-deps.log
  wait_port 6379 redis-server
fi

# PostgreSQL: the newest installed cluster, started if down.
if ! listening 5432; then
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$version" ]; then
    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    say "creating PostgreSQL $version cluster 'main'"
    pg_createcluster "$version" main >/dev/null
  fi
  say "starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
  wait_port 5432 postgresql
fi
pg_ok() { psql "postgresql://root@127.0.0.1:5432/test" -Atqc 'select 1' >/dev/null 2>&1; }
if ! pg_ok; then
  say "preparing Postgres: role root, database test, trust for loopback"
  su postgres -c "psql -Atqc \"DO \\\$\\\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='root') THEN CREATE ROLE root SUPERUSER LOGIN; END IF; END\\\$\\\$\"" >/dev/null
  su postgres -c "psql -Atqc \"SELECT 1 FROM pg_database WHERE datname='test'\"" | grep -q 1 \
    || su postgres -c "createdb -O root test"
  if ! pg_ok; then
    hba=$(su postgres -c "psql -Atqc 'show hba_file'")
    if ! grep -q '# cabine: loopback trust' "$hba"; then
      sed -i '1i # cabine: loopback trust (local development only)\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    su postgres -c "psql -Atqc 'select pg_reload_conf()'" >/dev/null
    sleep 0.5
  fi
  pg_ok || { say "cannot connect to postgresql://root@127.0.0.1:5432/test"; exit 1; }
fi

# NATS with JetStream.
if ! listening 4222; then
  say "starting nats-server with JetStream on 127.0.0.1:4222"
  nats=$(command -v nats-server || echo /usr/sbin/nats-server)
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec "$nats" -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port 4222 nats-server
fi

say "redis :6379, postgres :5432 (root@test), nats+jetstream :4222 are up"
