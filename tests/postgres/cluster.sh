#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the tests.
#
#   cluster.sh run CMD ARGS...   start a cluster, run CMD with REBUNO_TEST_POSTGRES_URL set to it,
#                                stop the cluster whatever CMD does, exit with CMD's status
#   cluster.sh start             start a cluster and print its URL (state kept under $STATE)
#   cluster.sh stop              stop the cluster `start` made and remove its files
#   cluster.sh crash             stop it as a crash would (pg_ctl stop -m immediate: no checkpoint,
#                                the next start replays the WAL)
#   cluster.sh restart           start it again after `crash`, on the same port
#
# When REBUNO_TEST_POSTGRES_URL is already set, `run` uses that server and starts nothing.
# The server packages are installed with apt-get when their binaries are missing. initdb refuses
# to run as root, so as root the cluster runs as the `postgres` user.
set -euo pipefail

PGVERSION=15
PGBIN=${PGBIN:-/usr/lib/postgresql/$PGVERSION/bin}
STATE=${REBUNO_PG_STATE:-$(cd "$(dirname "$0")" && pwd)/.cluster}

log() { echo "cluster.sh: $*" >&2; }

ensure_binaries() {
	if [[ -x $PGBIN/initdb && -x $PGBIN/pg_ctl ]]; then
		return
	fi
	log "installing postgresql-$PGVERSION (no binaries in $PGBIN)"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-$PGVERSION" >&2
	# The package starts a cluster of its own on 5432; the tests never use it.
	pg_ctlcluster "$PGVERSION" main stop >/dev/null 2>&1 || true
}

# as_owner runs a server binary as the user that owns the data directory.
as_owner() {
	if [[ $(id -u) == 0 ]]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

free_port() {
	local port
	for _ in $(seq 1 50); do
		port=$((20000 + RANDOM % 30000))
		if ! (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
	log "no free port found"
	return 1
}

# start_cluster DIR: initialises and starts a cluster in DIR, printing its URL.
start_cluster() {
	local dir=$1 port user=postgres
	ensure_binaries
	mkdir -p "$dir"
	if [[ $(id -u) == 0 ]]; then
		chown postgres:postgres "$dir"
	else
		user=$(id -un)
	fi
	as_owner "$PGBIN/initdb" -D "$dir/data" -U "$user" --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; return 1; }
	for attempt in 1 2 3; do
		port=$(free_port)
		if start_server "$dir" "$port"; then
			echo "$port" >"$dir/port"
			echo "postgres://$user@127.0.0.1:$port/postgres?sslmode=disable"
			return
		fi
		log "start on port $port failed (attempt $attempt)"
	done
	cat "$dir/server.log" >&2
	return 1
}

# start_server DIR PORT: starts the server of the cluster in DIR.
start_server() {
	local dir=$1 port=$2
	# Enough connections for several kernel replicas and the parallel test packages.
	as_owner "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
		-o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c max_connections=300" \
		start >/dev/null
}

# started_dir prints the folder of the cluster `start` made, or fails.
started_dir() {
	if [[ ! -f $STATE/dir ]]; then
		log "no cluster started under $STATE"
		return 1
	fi
	cat "$STATE/dir"
}

stop_cluster() {
	local dir=$1
	if [[ -d $dir/data ]]; then
		as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 || true
	fi
	rm -rf "$dir"
}

case ${1:-} in
run)
	shift
	if [[ -n ${REBUNO_TEST_POSTGRES_URL:-} ]]; then
		exec "$@"
	fi
	dir=$(mktemp -d "${TMPDIR:-/tmp}/rebuno-pg.XXXXXX")
	trap 'stop_cluster "$dir"' EXIT
	trap 'exit 130' INT TERM
	REBUNO_TEST_POSTGRES_URL=$(start_cluster "$dir")
	export REBUNO_TEST_POSTGRES_URL
	log "PostgreSQL $PGVERSION at $REBUNO_TEST_POSTGRES_URL"
	status=0
	"$@" || status=$?
	exit "$status"
	;;
start)
	if [[ -f $STATE/url ]]; then
		cat "$STATE/url"
		exit 0
	fi
	dir=$(mktemp -d "${TMPDIR:-/tmp}/rebuno-pg.XXXXXX")
	url=$(start_cluster "$dir") || { stop_cluster "$dir"; exit 1; }
	mkdir -p "$STATE"
	echo "$dir" >"$STATE/dir"
	echo "$url" >"$STATE/url"
	echo "$url"
	;;
stop)
	if [[ -f $STATE/dir ]]; then
		stop_cluster "$(cat "$STATE/dir")"
	fi
	rm -rf "$STATE"
	;;
crash)
	dir=$(started_dir)
	as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop >/dev/null
	;;
restart)
	dir=$(started_dir)
	start_server "$dir" "$(cat "$dir/port")"
	;;
*)
	echo "usage: $0 run CMD ARGS... | start | stop | crash | restart" >&2
	exit 2
	;;
esac
