#!/usr/bin/env bash
# Build the image the chart runs WITHOUT a Docker daemon and WITHOUT an image registry:
# where only the package registries are reachable (deb.debian.org, PyPI, Maven Central),
# helm/Dockerfile cannot be built (its base image, apache/spark, comes from Docker Hub).
#
# This script makes the same image contents from packages instead (see README.md here for
# how it differs from helm/Dockerfile):
#
#   1. a Debian bookworm root file system made with debootstrap, with OpenJDK 17 (headless),
#      Python 3.11, tini and procps; imported as the base image localhost/cursorsync-base;
#   2. on it, with buildah (chroot isolation, vfs storage: no daemon, no overlay, no
#      cgroups needed), the Dockerfile's steps: a venv at /opt/cursorsync/venv with the
#      cursorsync wheel and its pinned dependencies from PyPI (pyspark brings Spark's jars
#      and scripts; /opt/spark links to them), the /opt/cursorsync/main.py and
#      log4j2.properties links, the jars helm/image/jars.txt pins (fetch_jars.py, from
#      Maven Central), the driver/executor entrypoint at /opt/entrypoint.sh, user spark (185);
#   3. a smoke check of the committed image.
#
# Usage (as root; needs debootstrap, buildah, podman, runc and a python3 with pip):
#
#   apt-get install -y debootstrap buildah podman runc
#   helm/image/build-rootless.sh cursorsync:dev
#
# Everything goes under $IMGBUILD_DIR (default /tmp/imgbuild), the image store included
# (podman/buildah --root $IMGBUILD_DIR/storage). Use the same store options to look at,
# save or push the image, e.g.
#
#   podman --root /tmp/imgbuild/storage --runroot /tmp/imgbuild/runroot --storage-driver vfs \
#       push localhost/cursorsync:dev docker://registry.example.com/cursorsync:0.1.0
#
# Idempotent: a rerun reuses the base image if it is in the store (REBUILD_BASE=1 remakes
# it) and replaces the working container and the tag.
set -euo pipefail

TAG=${1:?usage: $0 TAG   (e.g. cursorsync:dev)}
# An unqualified name goes to localhost/, as podman/buildah would name it anyway.
[[ $TAG == */* ]] || TAG="localhost/$TAG"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${IMGBUILD_DIR:-/tmp/imgbuild}
SUITE=bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY=${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
MAVEN=${MAVEN:-https://repo1.maven.org/maven2}
BASE=localhost/cursorsync-base:$SUITE
CTR=cursorsync-build
# The apt packages the base image gets: Java for Spark (bookworm's newest is 17; Spark 4
# runs on 17 or 21), Python 3.11 with venv for the job, tini and procps (ps) for Spark's
# scripts and the entrypoint, bash for both.
PACKAGES=openjdk-17-jre-headless,python3,python3-venv,procps,tini,ca-certificates,bash
JAVA_HOME_IN_IMAGE=/usr/lib/jvm/java-17-openjdk-amd64

STORE=(--root "$WORK/storage" --runroot "$WORK/runroot" --storage-driver vfs)
bah() { buildah "${STORE[@]}" "$@"; }
pod() { podman "${STORE[@]}" "$@"; }
# Steps inside the image under construction: chroot isolation (crun cannot run containers
# on hosts with hybrid cgroups; chroot needs neither cgroups nor namespaces set-up).
run() { bah run --isolation chroot "$CTR" -- "$@"; }
# The steps that download (pip from PyPI, the jars from Maven Central) trust the CA bundle
# of the host that builds (BUILD_CA_BUNDLE): a network that intercepts TLS has its own CA
# there. It is bind-mounted read-only for those steps only and never stored in the image,
# which trusts Debian's ca-certificates alone.
BUILD_CA_BUNDLE=${BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
run_net() {
    if [[ -s $BUILD_CA_BUNDLE ]]; then
        bah run --isolation chroot -v "$BUILD_CA_BUNDLE:/tmp/build-ca.crt:ro" \
            -e SSL_CERT_FILE=/tmp/build-ca.crt -e PIP_CERT=/tmp/build-ca.crt "$CTR" -- "$@"
    else
        run "$@"
    fi
}
log() { printf '\n== %s\n' "$*"; }

[[ $(id -u) == 0 ]] || { echo "run as root (debootstrap and the vfs store need it)" >&2; exit 1; }
for tool in debootstrap buildah podman python3 git; do
    command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
mkdir -p "$WORK"

# --- 1. The cursorsync wheel, from a copy of the repository's working tree (tracked and
# untracked, not ignored files), so that the build leaves nothing in the repository.
log "wheel"
rm -rf "$WORK/src" "$WORK/dist"
mkdir -p "$WORK/src" "$WORK/dist"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do if [[ -e $f ]]; then printf '%s\0' "$f"; fi; done \
    | tar --null -T - -cf -) | tar -C "$WORK/src" -xf -
python3 -m pip wheel --quiet --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/cursorsync-*.whl)
echo "$WHEEL"

# --- 2. The base image: Debian bookworm from deb.debian.org, with the security and point
# release updates, the apt caches dropped, imported as $BASE.
if [[ ${REBUILD_BASE:-0} == 1 ]] && pod image exists "$BASE"; then
    pod rmi -f "$BASE" >/dev/null
fi
if ! pod image exists "$BASE"; then
    log "base image $BASE (debootstrap $SUITE)"
    rm -rf "$WORK/rootfs" "$WORK/rootfs.tar"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$WORK/rootfs" "$DEBIAN_MIRROR"
    cat > "$WORK/rootfs/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR $SUITE main
deb $DEBIAN_MIRROR $SUITE-updates main
deb $DEBIAN_SECURITY $SUITE-security main
EOF
    cp /etc/resolv.conf "$WORK/rootfs/etc/resolv.conf"
    mount -t proc proc "$WORK/rootfs/proc"
    trap 'umount "$WORK/rootfs/proc" 2>/dev/null || true' EXIT
    chroot "$WORK/rootfs" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get -y -q upgrade && apt-get clean'
    umount "$WORK/rootfs/proc"
    trap - EXIT
    # No apt lists or caches, logs or device nodes (the runtime provides /dev).
    rm -rf "$WORK"/rootfs/var/lib/apt/lists/* "$WORK"/rootfs/var/cache/apt/*.bin \
           "$WORK"/rootfs/var/log/*.log "$WORK"/rootfs/var/log/apt/* "$WORK"/rootfs/tmp/* \
           "$WORK"/rootfs/dev/*
    : > "$WORK/rootfs/etc/resolv.conf"
    tar -C "$WORK/rootfs" --numeric-owner --xattrs -cf "$WORK/rootfs.tar" .
    pod import --message "debootstrap $SUITE + $PACKAGES" "$WORK/rootfs.tar" "$BASE"
    rm -rf "$WORK/rootfs" "$WORK/rootfs.tar"
fi

# --- 3. The Dockerfile's steps, on the base image.
log "image $TAG from $BASE"
bah rm "$CTR" >/dev/null 2>&1 || true
bah from --name "$CTR" "$BASE" >/dev/null

# The venv and the wheel with its dependencies (pyspark carries Spark: jars, bin, sbin).
bah copy "$CTR" "$WHEEL" /tmp/wheels/
run python3 -m venv /opt/cursorsync/venv
run_net sh -c '/opt/cursorsync/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
               /tmp/wheels/cursorsync-*.whl && rm -rf /tmp/wheels'
# The CLI and Spark's log4j2 file at the fixed paths the chart names.
run sh -c 'set -e; py=/opt/cursorsync/venv/bin/python
  ln -sfn "$($py -c "import cursorsync, pathlib; print(pathlib.Path(cursorsync.__file__).with_name(\"__main__.py\"))")" /opt/cursorsync/main.py
  ln -sfn "$($py -c "import cursorsync.app, pathlib; print(pathlib.Path(cursorsync.app.__file__).with_name(\"log4j2.properties\"))")" /opt/cursorsync/log4j2.properties'

# SPARK_HOME=/opt/spark as in the apache/spark image: its bin, sbin and jars are pyspark's
# (the same Spark release the wheel pins), its work-dir the job's working directory.
run sh -c 'set -e; pyspark=$(/opt/cursorsync/venv/bin/python -c "import pyspark, os; print(os.path.dirname(pyspark.__file__))")
  mkdir -p /opt/spark/work-dir
  for d in bin sbin jars; do ln -sfn "$pyspark/$d" /opt/spark/$d; done'

# The jars helm/image/jars.txt pins (Delta, S3A), checked by fetch_jars.py, into Spark's jars.
bah copy "$CTR" "$HERE/jars.txt" "$HERE/fetch_jars.py" /tmp/image/
run_net sh -c "python3 /tmp/image/fetch_jars.py /tmp/image/jars.txt /opt/spark/jars --maven '$MAVEN' \
             && rm -rf /tmp/image"

# The entrypoint (driver/executor/pass-through, entrypoint.sh here) and the user, spark (185).
bah copy --chmod 755 "$CTR" "$HERE/entrypoint.sh" /opt/entrypoint.sh
run sh -c 'set -e
  getent group spark >/dev/null || groupadd --system --gid 185 spark
  getent passwd spark >/dev/null || useradd --system --uid 185 --gid spark --home-dir /opt/spark --no-create-home --shell /bin/false spark
  chown spark:spark /opt/spark/work-dir && chmod g+w /opt/spark/work-dir
  rm -rf /tmp/* /tmp/.[!.]* /root/.cache'

bah config \
    --env JAVA_HOME=$JAVA_HOME_IN_IMAGE \
    --env SPARK_HOME=/opt/spark \
    --env PATH=/opt/cursorsync/venv/bin:/opt/spark/bin:$JAVA_HOME_IN_IMAGE/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env PYSPARK_PYTHON=/opt/cursorsync/venv/bin/python \
    --env PYSPARK_DRIVER_PYTHON=/opt/cursorsync/venv/bin/python \
    --workingdir /opt/spark/work-dir \
    --entrypoint '["/opt/entrypoint.sh"]' \
    --user 185 \
    --label org.opencontainers.image.title=cursorsync \
    --label org.opencontainers.image.description="cursorsync on Debian $SUITE, OpenJDK 17, Python 3.11 (helm/image/build-rootless.sh)" \
    "$CTR"
bah commit --rm "$CTR" "$TAG"
# A rebuild leaves the previous image untagged; drop it (vfs stores every layer in full).
pod image prune -f >/dev/null

# --- 4. Smoke check: the CLI, the imports, Java, the jars. With podman and runc (the
# container's own namespaces, its entrypoint, user 185; explicit ulimits: podman's
# defaults exceed what a nested sandbox may set); with buildah's chroot isolation if that
# cannot run here.
log "smoke check of $TAG"
SMOKE='set -e
cursorsync --help | head -n 12
python -c "import sys, importlib.metadata as m, cursorsync, pyspark, deltalake, pulsar, delta; print(\"python\", sys.version.split()[0], *(f\"{d} {m.version(d)}\" for d in (\"cursorsync\", \"pyspark\", \"delta-spark\", \"deltalake\", \"pulsar-client\")))"
java -version 2>&1
id
ls -l /opt/cursorsync/main.py /opt/cursorsync/log4j2.properties
ls /opt/spark/jars | grep -E "^(delta-|hadoop-aws|s3-2)"
# The entrypoint, as Spark on Kubernetes starts its containers: the driver runs the job
# through spark-submit; an executor starts Spark'"'"'s Kubernetes backend, which parses its
# arguments and then fails to reach a driver that is not there.
/opt/entrypoint.sh driver --conf spark.ui.enabled=false local:///opt/cursorsync/main.py --help 2>/dev/null | head -n 3
out=$(SPARK_EXECUTOR_MEMORY=512m SPARK_DRIVER_URL=spark://CoarseGrainedScheduler@127.0.0.1:1 \
      SPARK_EXECUTOR_ID=1 SPARK_EXECUTOR_CORES=1 SPARK_APPLICATION_ID=smoke \
      SPARK_EXECUTOR_POD_IP=127.0.0.1 SPARK_JAVA_OPT_0=-Dcursorsync.smoke=1 \
      timeout 120 /opt/entrypoint.sh executor 2>&1 || true)
echo "$out" | grep -m1 -o "Started daemon with process name: [^ ]*" || { echo "$out" | tail -n 20; exit 1; }
echo "$out" | grep -m1 -o "Failed to connect to [^ ]*" '
if command -v runc >/dev/null && pod --runtime runc run --rm --network none \
        --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 "$TAG" true >/dev/null 2>&1; then
    pod --runtime runc run --rm --network none \
        --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 "$TAG" bash -c "$SMOKE"
else
    echo "(podman run cannot run containers here; smoke check with buildah run --isolation chroot)"
    bah rm cursorsync-smoke >/dev/null 2>&1 || true
    bah from --name cursorsync-smoke "$TAG" >/dev/null
    bah run --isolation chroot cursorsync-smoke -- bash -c "$SMOKE"
    bah rm cursorsync-smoke >/dev/null
fi

log "built $TAG"
pod images --filter reference="$TAG"
