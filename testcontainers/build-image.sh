#!/usr/bin/env bash
# Build a ZooKeeper Docker image WITHOUT a container registry.
#
#   build-image.sh [TAG]            (default TAG: zk-recipes/zookeeper:3.8-local)
#
# The image is made from a Debian root filesystem (debootstrap, from the Debian
# mirror the host's apt already uses) with Debian's ZooKeeper library packages
# (libzookeeper-java, ZooKeeper 3.8.x), then `docker import`ed. It behaves like
# the official `zookeeper` image for the settings tests use: same entrypoint
# variables (ZOO_MY_ID, ZOO_SERVERS, ZOO_TICK_TIME, ZOO_INIT_LIMIT,
# ZOO_SYNC_LIMIT, ZOO_MAX_CLIENT_CNXNS, ZOO_4LW_COMMANDS_WHITELIST,
# ZOO_CFG_EXTRA, ZOO_STANDALONE_ENABLED, ZOO_ADMINSERVER_ENABLED, ...), client
# port 2181, `zkServer.sh start-foreground`, logs on stdout.
#
# Idempotent: does nothing if TAG already exists. Needs root, docker, apt-get
# (installs debootstrap if missing) and network access to the Debian mirror.
# Takes 1 to 3 minutes (measured 53 s to 153 s) and produces an image of about 370 MB.
#
# Environment overrides:
#   DEBIAN_MIRROR   mirror URL for debootstrap (default: read from host apt sources)
#   DEBIAN_SUITE    Debian release to use (default: bookworm)
#   BUILD_DIR       scratch directory (default: ${TMPDIR:-/var/tmp})
set -euo pipefail

TAG="${1:-zk-recipes/zookeeper:3.8-local}"
SUITE="${DEBIAN_SUITE:-bookworm}"

log() { printf '[build-image] %s\n' "$*" >&2; }
die() { printf '[build-image] ERROR: %s\n' "$*" >&2; exit 1; }

if ! command -v docker >/dev/null 2>&1; then
    die "the docker CLI is not installed; install Docker (https://docs.docker.com/engine/install/) and retry"
fi
if ! docker info >/dev/null 2>&1; then
    die "cannot talk to the Docker daemon (docker info failed); start Docker or run as a user in the 'docker' group"
fi
if docker image inspect "$TAG" >/dev/null 2>&1; then
    log "image $TAG already exists; nothing to do (docker rmi $TAG to rebuild)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    die "must run as root (debootstrap and chroot need it): sudo $0 $TAG"
fi
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script needs a Debian/Ubuntu host"

# Find the Debian mirror the host's apt already uses (deb822 *.sources or one-line sources.list).
find_mirror() {
    local f
    # deb822: a stanza with "URIs:" and "Suites:" containing the suite.
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v suite="$SUITE" '
            BEGIN { RS=""; FS="\n" }
            {
                uris=""; suites=""; types=""; enabled="yes"
                for (i=1;i<=NF;i++) {
                    line=$i
                    if (line ~ /^[ \t]*#/) continue
                    if (tolower(line) ~ /^uris:/)    { sub(/^[^:]*:[ \t]*/, "", line); uris=line }
                    if (tolower(line) ~ /^suites:/)  { sub(/^[^:]*:[ \t]*/, "", line); suites=" " line " " }
                    if (tolower(line) ~ /^types:/)   { sub(/^[^:]*:[ \t]*/, "", line); types=" " line " " }
                    if (tolower(line) ~ /^enabled:/) { sub(/^[^:]*:[ \t]*/, "", line); enabled=tolower(line) }
                }
                if (enabled != "no" && types ~ / deb / && suites ~ (" " suite " ")) {
                    split(uris, u, /[ \t]+/); print u[1]; exit
                }
            }' "$f"
    done
    # one-line format: deb [opts] URI SUITE COMPONENTS...
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        sed -e 's/\[[^]]*\]//' "$f" | awk -v suite="$SUITE" '$1=="deb" && $3==suite { print $2; exit }'
    done
}

MIRROR="${DEBIAN_MIRROR:-}"
if [ -z "$MIRROR" ]; then
    MIRROR="$(find_mirror | grep -E '^(https?|file)://' | head -n1 || true)"
fi
[ -n "$MIRROR" ] || die "no apt source for Debian '$SUITE' found in /etc/apt/sources.list{,.d}; set DEBIAN_MIRROR=<a Debian mirror URL> (and DEBIAN_SUITE if not $SUITE)"
log "using Debian mirror $MIRROR (suite $SUITE)"

if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (apt-get update && apt-get install debootstrap)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends debootstrap >&2
fi

# Pass an apt proxy configured on the host to debootstrap and the chroot.
APT_PROXY="$(apt-config shell P Acquire::http::Proxy 2>/dev/null | sed -n "s/^P='\(.*\)'$/\1/p" || true)"
if [ -n "$APT_PROXY" ] && [ -z "${http_proxy:-}" ]; then
    export http_proxy="$APT_PROXY"
    log "using the host's apt proxy $APT_PROXY"
fi

WORK="$(mktemp -d "${BUILD_DIR:-${TMPDIR:-/var/tmp}}/zk-image.XXXXXX")"
ROOTFS="$WORK/rootfs"
mkdir -p "$ROOTFS"

unmount_all() {
    # Unmount everything below ROOTFS, deepest first.
    local m
    for m in $(awk -v r="$ROOTFS" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
}
cleanup() {
    local rc=$?
    unmount_all
    if awk -v r="$ROOTFS" 'index($2, r) == 1 { found=1 } END { exit !found }' /proc/mounts; then
        log "WARNING: something is still mounted under $ROOTFS; leaving $WORK in place"
    else
        rm -rf "$WORK"
    fi
    if [ "$rc" != 0 ]; then log "build FAILED (exit $rc)"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

START=$(date +%s)
log "[1/4] debootstrap --variant=minbase $SUITE into $ROOTFS"
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 30 "$WORK/debootstrap.log" >&2
    die "debootstrap failed (full log above); check network access to $MIRROR or set DEBIAN_MIRROR"
}

log "[2/4] installing openjdk-17-jre-headless + libzookeeper-java in the chroot"
mount -t proc proc "$ROOTFS/proc"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
chmod +x "$ROOTFS/usr/sbin/policy-rc.d"
if [ -n "$APT_PROXY" ]; then
    printf 'Acquire::http::Proxy "%s";\n' "$APT_PROXY" >"$ROOTFS/etc/apt/apt.conf.d/99build-proxy"
fi
chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    http_proxy="${http_proxy:-}" /bin/sh -c '
    set -e
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
        openjdk-17-jre-headless libzookeeper-java libslf4j-java liblog4j1.2-java
    apt-get clean
' >"$WORK/chroot.log" 2>&1 || {
    tail -n 30 "$WORK/chroot.log" >&2
    die "package installation in the chroot failed (log above)"
}
[ -f "$ROOTFS/usr/share/java/zookeeper.jar" ] || die "zookeeper.jar missing after installing libzookeeper-java"

log "[3/4] adding /docker-entrypoint.sh, zkServer.sh and log4j config"
mkdir -p "$ROOTFS/conf" "$ROOTFS/data" "$ROOTFS/datalog" "$ROOTFS/logs" "$ROOTFS/opt/zookeeper/log4j"
cat >"$ROOTFS/opt/zookeeper/log4j/log4j.properties" <<'EOF'
# Everything to the console (stdout), like the official image.
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.Target=System.out
log4j.appender.CONSOLE.Threshold=INFO
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} [myid:%X{myid}] - %-5p [%t:%C{1}@%L] - %m%n
EOF

cat >"$ROOTFS/docker-entrypoint.sh" <<'EOF'
#!/bin/bash
# Entry point compatible with the official zookeeper image's variables.
set -e
: "${ZOO_CONF_DIR:=/conf}" "${ZOO_DATA_DIR:=/data}" "${ZOO_DATA_LOG_DIR:=/datalog}" "${ZOO_LOG_DIR:=/logs}"
: "${ZOO_TICK_TIME:=2000}" "${ZOO_INIT_LIMIT:=5}" "${ZOO_SYNC_LIMIT:=2}"
: "${ZOO_AUTOPURGE_PURGEINTERVAL:=0}" "${ZOO_AUTOPURGE_SNAPRETAINCOUNT:=3}"
: "${ZOO_MAX_CLIENT_CNXNS:=0}" "${ZOO_STANDALONE_ENABLED:=true}" "${ZOO_ADMINSERVER_ENABLED:=false}"
mkdir -p "$ZOO_CONF_DIR" "$ZOO_DATA_DIR" "$ZOO_DATA_LOG_DIR" "$ZOO_LOG_DIR"

# Generate the config only if it does not exist (kept across container restarts).
if [[ ! -f "$ZOO_CONF_DIR/zoo.cfg" ]]; then
    CONFIG="$ZOO_CONF_DIR/zoo.cfg"
    {
        echo "dataDir=$ZOO_DATA_DIR"
        echo "dataLogDir=$ZOO_DATA_LOG_DIR"
        echo "tickTime=$ZOO_TICK_TIME"
        echo "initLimit=$ZOO_INIT_LIMIT"
        echo "syncLimit=$ZOO_SYNC_LIMIT"
        echo "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT"
        echo "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL"
        echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
        echo "standaloneEnabled=$ZOO_STANDALONE_ENABLED"
        echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
    } >>"$CONFIG"
    if [[ -z $ZOO_SERVERS ]]; then
        ZOO_SERVERS="server.1=localhost:2888:3888;2181"
    fi
    for server in $ZOO_SERVERS; do
        echo "$server" >>"$CONFIG"
    done
    if [[ -n $ZOO_4LW_COMMANDS_WHITELIST ]]; then
        echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST" >>"$CONFIG"
    fi
    for cfg_extra_entry in $ZOO_CFG_EXTRA; do
        echo "$cfg_extra_entry" >>"$CONFIG"
    done
fi

# Write myid only if it does not exist.
if [[ ! -f "$ZOO_DATA_DIR/myid" ]]; then
    echo "${ZOO_MY_ID:-1}" >"$ZOO_DATA_DIR/myid"
fi

exec "$@"
EOF

cat >"$ROOTFS/usr/local/bin/zkServer.sh" <<'EOF'
#!/bin/bash
# Minimal zkServer.sh: only `start-foreground` (and `print-cmd`) are supported.
set -e
ZOOCFGDIR="${ZOO_CONF_DIR:-/conf}"
ZOOCFG="${2:-$ZOOCFGDIR/zoo.cfg}"
# zookeeper.jar's manifest Class-Path pulls in jute, netty, jackson, metrics,
# snappy, jetty, commons-*; add the SLF4J -> log4j 1.2 binding and its config.
CLASSPATH="/opt/zookeeper/log4j:/usr/share/java/zookeeper.jar:/usr/share/java/zookeeper-jute.jar"
CLASSPATH="$CLASSPATH:/usr/share/java/slf4j-api.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
JVMFLAGS="${JVMFLAGS:--Xmx512m -XX:+UseSerialGC}"
CMD=(java "-Dzookeeper.log.dir=${ZOO_LOG_DIR:-/logs}" "-Dlog4j.configuration=file:/opt/zookeeper/log4j/log4j.properties"
     $JVMFLAGS -cp "$CLASSPATH" org.apache.zookeeper.server.quorum.QuorumPeerMain "$ZOOCFG")
case "${1:-}" in
    start-foreground) exec "${CMD[@]}" ;;
    print-cmd) echo "${CMD[@]}" ;;
    *) echo "usage: zkServer.sh start-foreground|print-cmd [zoo.cfg]" >&2; exit 1 ;;
esac
EOF
chmod 0755 "$ROOTFS/docker-entrypoint.sh" "$ROOTFS/usr/local/bin/zkServer.sh"

# Slim down and undo build-only changes.
rm -f "$ROOTFS/usr/sbin/policy-rc.d" "$ROOTFS/etc/apt/apt.conf.d/99build-proxy"
: >"$ROOTFS/etc/resolv.conf"
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/usr/share/doc/* \
    "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/*

unmount_all
if awk -v r="$ROOTFS" 'index($2, r) == 1 { found=1 } END { exit !found }' /proc/mounts; then
    die "could not unmount everything under $ROOTFS; refusing to tar it"
fi

log "[4/4] docker import -> $TAG"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENTRYPOINT ["/docker-entrypoint.sh"]' \
    --change 'CMD ["zkServer.sh", "start-foreground"]' \
    --change 'EXPOSE 2181 2888 3888 8080' \
    --change 'WORKDIR /' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV ZOO_CONF_DIR=/conf ZOO_DATA_DIR=/data ZOO_DATA_LOG_DIR=/datalog ZOO_LOG_DIR=/logs' \
    --change 'LABEL org.opencontainers.image.description="ZooKeeper (Debian libzookeeper-java) built offline by zk-testcontainers/build-image.sh"' \
    --message "zk-testcontainers build-image.sh ($SUITE, libzookeeper-java)" \
    - "$TAG" >/dev/null

SIZE="$(docker image inspect --format '{{.Size}}' "$TAG" | awk '{ printf "%d MB", $1/1000/1000 }')"
log "built $TAG ($SIZE) in $(( $(date +%s) - START )) s"
