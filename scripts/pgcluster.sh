# shellcheck shell=bash
# Shared by scripts/backup and scripts/restore: which PostgreSQL cluster, and how to reach it.
#
# The cluster is scripts/infra's (its data dir from .run/pg.home, its port from .run/config, the
# superuser's password from .run/secrets/pg-postgres) unless options name another:
#   --data-dir DIR  --port PORT  --host HOST  --user USER  (password: PGPASSWORD)
#   --archive-dir DIR   the WAL archive (archive_command copies there; default: DIR/../wal-archive)
#   --backup-dir DIR    where base backups go (default: DIR/../backups)
# Waits are bounded: NIUNIU_BACKUP_TIMEOUT seconds (default 600) for a base backup or a recovery.

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$PROG" "$*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
RUN=${NIUNIU_RUN_DIR:-$ROOT/.run}
TIMEOUT=${NIUNIU_BACKUP_TIMEOUT:-600}
DATA_DIR= PORT= HOST=127.0.0.1 PGUSER_=postgres ARCHIVE_DIR= BACKUP_DIR=

find_pgbin() {
    local d best=
    for d in /usr/lib/postgresql/*/bin; do
        [[ -x $d/pg_basebackup && -x $d/pg_ctl ]] || continue
        if [[ -z $best ]] || (($(basename "$(dirname "$d")") > $(basename "$(dirname "$best")"))); then best=$d; fi
    done
    [[ -n $best ]] || die "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin"
    PGBIN=$best
}

# Options common to both scripts; the caller's own options are left in REST.
cluster_options() {
    REST=()
    while (($#)); do
        case $1 in
            --data-dir) DATA_DIR=$2; shift 2 ;;
            --port) PORT=$2; shift 2 ;;
            --host) HOST=$2; shift 2 ;;
            --user) PGUSER_=$2; shift 2 ;;
            --archive-dir) ARCHIVE_DIR=$2; shift 2 ;;
            --backup-dir) BACKUP_DIR=$2; shift 2 ;;
            *) REST+=("$1"); shift ;;
        esac
    done
    if [[ -z $DATA_DIR ]]; then
        [[ -s $RUN/pg.home ]] || die "no --data-dir and no cluster of scripts/infra ($RUN/pg.home)"
        DATA_DIR=$(<"$RUN/pg.home")/data
    fi
    if [[ -z $PORT ]]; then
        PORT=$(sed -n 's/^NIUNIU_PG_PORT=//p' "$RUN/config" 2>/dev/null || true)
        PORT=${PORT:-54329}
    fi
    if [[ -z ${PGPASSWORD:-} && -s $RUN/secrets/pg-postgres && $PGUSER_ == postgres ]]; then
        PGPASSWORD=$(<"$RUN/secrets/pg-postgres")
    fi
    export PGPASSWORD=${PGPASSWORD:-} PGCONNECT_TIMEOUT=10
    DATA_DIR=${DATA_DIR%/}
    ARCHIVE_DIR=${ARCHIVE_DIR:-$(dirname "$DATA_DIR")/wal-archive}
    BACKUP_DIR=${BACKUP_DIR:-$(dirname "$DATA_DIR")/backups}
    find_pgbin
}

# The data dir's owner runs the server's programs (PostgreSQL refuses to run as root).
owner() { stat -c %U "$(dirname "$DATA_DIR")"; }
as_owner() {
    if ((EUID == 0)) && [[ $(owner) != root ]]; then runuser -u "$(owner)" -- "$@"; else "$@"; fi
}

sql() { # query
    "$PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$HOST" -p "$PORT" -U "$PGUSER_" -d postgres -c "$1"
}

running() { [[ -f $DATA_DIR/postmaster.pid ]] && as_owner "$PGBIN/pg_ctl" -D "$DATA_DIR" status >/dev/null 2>&1; }
