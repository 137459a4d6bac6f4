#!/usr/bin/env bash
# Make sure the services the test suite needs are running; start any that is not.
# Fails loudly (exit 1) if one cannot be reached: the suite never skips a backend.
set -uo pipefail

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # name port seconds
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    port_open "$2" && return 0
    sleep 0.1
  done
  return 1
}

start_postgres() {
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
  fi
}

start_mariadb() {
  if command -v start-stop-daemon >/dev/null 2>&1 && [ -x /usr/sbin/mariadbd ]; then
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  fi
}

start_redis() {
  if command -v redis-server >/dev/null 2>&1; then
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  fi
}

start_rabbitmq() {
  if command -v rabbitmq-server >/dev/null 2>&1; then
    rabbitmq-server -detached
  fi
}

failed=0
for svc in "postgres 5432 start_postgres 30" "mariadb 3306 start_mariadb 30" \
  "redis 6379 start_redis 30" "rabbitmq 5672 start_rabbitmq 90"; do
  set -- $svc
  if port_open "$2"; then
    echo "services: $1 is running on 127.0.0.1:$2"
    continue
  fi
  echo "services: $1 is not running on 127.0.0.1:$2; starting it"
  "$3" || true
  if wait_port "$1" "$2" "$4"; then  # RabbitMQ takes several seconds to boot
    echo "services: $1 started"
  else
    echo "services: ERROR: $1 is unreachable on 127.0.0.1:$2 and could not be started" >&2
    failed=1
  fi
done
exit $failed
