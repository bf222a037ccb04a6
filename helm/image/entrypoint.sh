#!/bin/bash
# The container entrypoint of the image build-rootless.sh makes (/opt/entrypoint.sh, run
# under tini). Spark on Kubernetes starts the driver's container with "driver <spark-submit
# arguments>" and each executor's with "executor", passing what they need in environment
# variables (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, ...); this script turns those into the
# commands. Anything else runs as given (`cursorsync status ...`, a shell).
set -euo pipefail

: "${SPARK_HOME:=/opt/spark}"

# Spark and the JVM look the running uid up; an image run under an arbitrary uid (OpenShift)
# has no passwd entry for it.
if ! getent passwd "$(id -u)" >/dev/null 2>&1 && [ -w /etc/passwd ]; then
  echo "$(id -u):x:$(id -u):$(id -g):${SPARK_USER_NAME:-spark}:${SPARK_HOME}:/bin/false" \
    >>/etc/passwd
fi

# The executors' class path: the configuration directories first, then Spark's jars (the
# Delta and S3A jars are among them), then what the pod spec adds.
classpath="${SPARK_HOME}/jars/*"
if [ -n "${SPARK_CONF_DIR:-}" ]; then
  classpath="${SPARK_CONF_DIR}:${classpath}"
else
  classpath="${SPARK_HOME}/conf:${classpath}"
fi
if [ -n "${HADOOP_CONF_DIR:-}" ]; then
  classpath="${HADOOP_CONF_DIR}:${classpath}"
fi
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
  classpath="${classpath}:${SPARK_EXTRA_CLASSPATH}"
fi

case "${1:-}" in
  driver)
    shift
    # The driver runs in this container: client mode, bound to the pod's address.
    exec "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS:-}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # The driver hands each executor its JVM options as SPARK_JAVA_OPT_0, _1, ... in order.
    java_opts=()
    while IFS= read -r name; do
      java_opts+=("${!name}")
    done < <(compgen -e | grep '^SPARK_JAVA_OPT_[0-9]*$' | sort -t_ -k4 -n)
    exec java "${java_opts[@]}" \
      "-Xms${SPARK_EXECUTOR_MEMORY:?}" "-Xmx${SPARK_EXECUTOR_MEMORY:?}" \
      -cp "$classpath" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL:?}" \
      --executor-id "${SPARK_EXECUTOR_ID:?}" \
      --cores "${SPARK_EXECUTOR_CORES:?}" \
      --app-id "${SPARK_APPLICATION_ID:?}" \
      --hostname "${SPARK_EXECUTOR_POD_IP:?}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-}" \
      "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
