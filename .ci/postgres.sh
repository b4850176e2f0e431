# Starts a throwaway PostgreSQL server on 127.0.0.1 for the tests of the store's PostgreSQL
# backend, and exports RETHREAD_TEST_POSTGRES_URL. Sourced by .ci/run (and usable by hand:
# `source .ci/postgres.sh && rethread_start_postgres`); the server is stopped when the shell
# exits. Installs the distribution's `postgresql` package when no server binaries are found.

rethread_find_pg_bin() {
    local candidate found=""
    for candidate in "$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/pg_ctl)")" \
        /usr/lib/postgresql/*/bin; do
        if [ -x "$candidate/initdb" ] && [ -x "$candidate/pg_ctl" ]; then
            found="$candidate" # the glob sorts ascending: the newest version wins
        fi
    done
    echo "$found"
}

rethread_start_postgres() {
    local started=$SECONDS bin user port dir
    bin="$(rethread_find_pg_bin)"
    if [ -z "$bin" ]; then
        echo "postgres: no server binaries; installing the postgresql package" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
        bin="$(rethread_find_pg_bin)"
    fi
    if [ -z "$bin" ]; then
        echo "postgres: initdb/pg_ctl not found after installing postgresql" >&2
        return 1
    fi
    # initdb refuses to run as root: run the server as an unprivileged user.
    user="$(id -un)"
    if [ "$(id -u)" = 0 ]; then
        user=postgres
        id -u "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
    fi
    dir="$(mktemp -d "${TMPDIR:-/tmp}/rethread-pg.XXXXXX")"
    chown "$user" "$dir"
    # A free port: the first from 54320 that nothing answers on.
    port=54320
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    local as=()
    [ "$(id -u)" = 0 ] && as=(runuser -u "$user" --)
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; return 1; }
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=200" start >/dev/null \
        || { cat "$dir/server.log" >&2; return 1; }
    RETHREAD_PG_DIR="$dir"
    RETHREAD_PG_BIN="$bin"
    RETHREAD_PG_USER="$user"
    trap rethread_stop_postgres EXIT
    "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres rethread_test
    export RETHREAD_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/rethread_test"
    echo "postgres: $("$bin/postgres" --version) on 127.0.0.1:$port (ready in $((SECONDS - started)) s)" >&2
}

rethread_stop_postgres() {
    [ -n "${RETHREAD_PG_DIR:-}" ] || return 0
    local as=()
    [ "$(id -u)" = 0 ] && as=(runuser -u "$RETHREAD_PG_USER" --)
    "${as[@]}" "$RETHREAD_PG_BIN/pg_ctl" -D "$RETHREAD_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$RETHREAD_PG_DIR"
    RETHREAD_PG_DIR=""
}
