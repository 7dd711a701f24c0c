"""The Kubernetes manifests of the stages' cluster jobs, built from the stage registry and the config's
`launcher` and `spark` sections: a SparkApplication (the Spark operator's sparkoperator.k8s.io/v1beta2)
per Spark stage, and a Kubeflow PyTorchJob (kubeflow.org/v1) per torch stage.

The DAG's cluster-job tasks submit these (gem.deploy.operators, `launcher.kind: cluster_job`), and
`python -m gem.deploy render` writes them under deploy/k8s/ with the same arguments: the run day and
the run's from_stage as the Jinja expressions the operators render per task instance
(orchestration.DAY_EXPR, FROM_STAGE_EXPR). Every pod runs the image deploy/Dockerfile builds, reads
the config from the ConfigMap CONFIG_MAP (mounted at CONFIG_DIR, named by $GEM_CONFIG) and takes the
object store's credentials from the Secret OBJECT_STORE_SECRET through secretKeyRef; no manifest holds
a credential. Each runs the stage through gem.deploy.launch, as the in-process task runs it.

Imported when a DAG with `launcher.kind: cluster_job` is parsed: no Spark, torch or Kubernetes client.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gem.deploy.launch import LAUNCH_MODULE, launch_args
from gem.environment import CONFIG_FILE_ENV
from gem.lakehouse.stages import Stage
from gem.pipeline.airflow.orchestration import DISTRIBUTED_STAGES, REPO_ROOT, stage_processes

if TYPE_CHECKING:
    from gem.config import LauncherConfig, SparkConfig

# Where deploy/Dockerfile puts the checkout, and the Python its image runs.
IMAGE_ROOT = "/opt/gem"
IMAGE_PYTHON = "3.11"
# The config every pod reads: one ConfigMap key, mounted as a file. Its name has no .yaml suffix:
# SparkKubernetesOperator reads any templated value ending in .yaml (the $GEM_CONFIG it sets) as a
# template file's name.
CONFIG_MAP = "gem-config"
CONFIG_KEY = "config"
CONFIG_DIR = "/etc/gem"
CONFIG_VOLUME = "gem-config"
# The object store's credentials: a Secret the operator of the cluster creates (docs/cluster.md); the
# first two keys are required, the others optional (an S3 API other than AWS's names its endpoint).
OBJECT_STORE_SECRET = "gem-object-store"
REQUIRED_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
OPTIONAL_SECRET_KEYS = ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ALLOW_HTTP")
# The Spark settings spark-submit of the jobs uses (Delta's session extension and catalog).
SPARK_DEFAULTS = REPO_ROOT / "infra" / "spark" / "spark-defaults.conf"
# The image holds the Delta and S3A jars (fetched by Maven at build time, as `make setup` does): on
# the class path of the driver and the executors instead of spark.jars.packages (no download at run time).
IMAGE_JARS = f"{IMAGE_ROOT}/.cache/jars/*"
# The service account the Spark operator's Helm chart creates in each job namespace for the drivers.
SPARK_SERVICE_ACCOUNT = "spark-operator-spark"
# An executor's size unless the config's spark.conf names one.
EXECUTOR_CORES = "1"
EXECUTOR_MEMORY = "2g"
# torchrun's c10d rendezvous: on the first worker pod's service, which the training operator creates.
RDZV_PORT = 29400
# Node failures an elastic training job survives (torchrun restarts its workers from the last checkpoint).
MAX_RESTARTS = 3
# The training operator keeps a finished PyTorchJob (and its pods' logs) this long.
FINISHED_JOB_TTL_S = 24 * 3600
PART_OF = "gem"


def resource_name(stage_name: str) -> str:
    """A stage's Kubernetes name: gem-<stage>, underscores as dashes (DNS-1123)."""
    return f"gem-{stage_name.replace('_', '-')}"


def labels(stage_name: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/component": resource_name(stage_name)}


def stage_env() -> list[dict[str, Any]]:
    """A stage container's variables: the config file, and each object-store credential as a
    reference to its key in OBJECT_STORE_SECRET (never a value)."""
    def secret(key: str, optional: bool) -> dict[str, Any]:
        ref: dict[str, Any] = {"name": OBJECT_STORE_SECRET, "key": key}
        if optional:
            ref["optional"] = True
        return {"name": key, "valueFrom": {"secretKeyRef": ref}}

    return [{"name": CONFIG_FILE_ENV, "value": f"{CONFIG_DIR}/{CONFIG_KEY}"},
            *(secret(k, False) for k in REQUIRED_SECRET_KEYS), *(secret(k, True) for k in OPTIONAL_SECRET_KEYS)]


def config_volume() -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "configMap": {"name": CONFIG_MAP}}


def config_mount() -> dict[str, Any]:
    return {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}


def spark_defaults(path: Path = SPARK_DEFAULTS) -> dict[str, str]:
    """The settings of a spark-defaults.conf file (`key value` lines; `#` starts a comment line)."""
    settings = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            settings[key] = value.strip()
    return settings


def spark_conf(spark: SparkConfig) -> dict[str, str]:
    """A SparkApplication's sparkConf: the jobs' spark-submit settings (SPARK_DEFAULTS) with the
    image's jars on the class path instead of spark.jars.packages, then the config's own spark.conf
    (the executors' size goes to the executor section instead)."""
    conf = {k: v for k, v in spark_defaults().items() if k != "spark.jars.packages"}
    conf |= {"spark.driver.extraClassPath": IMAGE_JARS, "spark.executor.extraClassPath": IMAGE_JARS,
             "spark.sql.shuffle.partitions": str(spark.shuffle_partitions)}
    conf |= {k: v for k, v in spark.conf.items() if k not in ("spark.executor.cores", "spark.executor.memory")}
    return dict(sorted(conf.items()))


def spark_application(stage: Stage, launcher: LauncherConfig, spark: SparkConfig, run_day: str,
                      from_stage: str) -> dict[str, Any]:
    """The SparkApplication of a Spark stage's run: the driver runs gem.deploy.launch as the main
    application file (its session is spark-submit's, gem.lakehouse.spark), with
    launcher.spark_executors executors. restartPolicy Never: a failed day is the Airflow task's
    retry, as for every task."""
    if not stage.spark:
        raise ValueError(f"stage {stage.name} runs no Spark; its cluster job is a PyTorchJob (pytorch_job)")
    def pod() -> dict[str, Any]:
        return {"labels": labels(stage.name), "env": stage_env(), "volumeMounts": [config_mount()]}

    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": resource_name(stage.name), "namespace": launcher.namespace, "labels": labels(stage.name)},
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": launcher.image,
            "imagePullPolicy": "IfNotPresent",
            "mainApplicationFile": f"local://{IMAGE_ROOT}/{LAUNCH_MODULE.replace('.', '/')}.py",
            "arguments": launch_args(stage.name, run_day, from_stage),
            "sparkVersion": importlib.metadata.version("pyspark"),
            "restartPolicy": {"type": "Never"},
            "sparkConf": spark_conf(spark),
            "volumes": [config_volume()],
            "driver": {"cores": 1, "memory": spark.driver_memory, "serviceAccount": SPARK_SERVICE_ACCOUNT, **pod()},
            "executor": {"instances": launcher.spark_executors,
                         "cores": int(spark.conf.get("spark.executor.cores", EXECUTOR_CORES)),
                         "memory": spark.conf.get("spark.executor.memory", EXECUTOR_MEMORY), **pod()},
        },
    }


def pytorch_job(stage: Stage, launcher: LauncherConfig, run_day: str, from_stage: str) -> dict[str, Any]:
    """The PyTorchJob of a torch stage's run, named for its day: an elastic job (torchrun's c10d
    rendezvous on the first worker's service) of launcher.min_nodes..max_nodes pods with
    `stage_processes` ranks each for DISTRIBUTED_STAGES, one pod with one process for the others.
    Each pod asks for launcher.gpus_per_node GPUs (at most one outside DISTRIBUTED_STAGES)."""
    if stage.spark:
        raise ValueError(f"stage {stage.name} runs on Spark; its cluster job is a SparkApplication (spark_application)")
    distributed = stage.name in DISTRIBUTED_STAGES
    low, high = (launcher.min_nodes, launcher.max_nodes) if distributed else (1, 1)
    processes = stage_processes(stage.name, launcher)
    gpus = launcher.gpus_per_node if distributed else min(launcher.gpus_per_node, 1)
    name = f"{resource_name(stage.name)}-{run_day}"
    container: dict[str, Any] = {
        "name": "pytorch",  # the container the training operator configures
        "image": launcher.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["torchrun"],
        "args": [f"--nnodes={low}:{high}", f"--nproc-per-node={processes}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={name}-worker-0:{RDZV_PORT}", f"--rdzv-id={name}",
                 f"--max-restarts={MAX_RESTARTS}", "-m", LAUNCH_MODULE, *launch_args(stage.name, run_day, from_stage)],
        "ports": [{"name": "pytorchjob-port", "containerPort": RDZV_PORT}],
        "env": stage_env(),
        "volumeMounts": [config_mount()],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": launcher.namespace, "labels": labels(stage.name)},
        "spec": {
            "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": low, "maxReplicas": high,
                              "nProcPerNode": processes, "maxRestarts": MAX_RESTARTS},
            "runPolicy": {"cleanPodPolicy": "None", "ttlSecondsAfterFinished": FINISHED_JOB_TTL_S},
            "pytorchReplicaSpecs": {"Worker": {
                "replicas": high,
                "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": labels(stage.name)},
                             "spec": {"containers": [container], "volumes": [config_volume()]}},
            }},
        },
    }


def cluster_job(stage: Stage, launcher: LauncherConfig, spark: SparkConfig, run_day: str,
                from_stage: str) -> dict[str, Any]:
    """A stage's cluster job: its SparkApplication for a Spark stage, its PyTorchJob otherwise."""
    if stage.spark:
        return spark_application(stage, launcher, spark, run_day, from_stage)
    return pytorch_job(stage, launcher, run_day, from_stage)


def pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a PyTorchJob, each as a core v1 PodTemplate (a kind the Kubernetes API's
    own schema covers), so they can be validated as the pods they become."""
    return [{"apiVersion": "v1", "kind": "PodTemplate",
             "metadata": {"name": f"{manifest['metadata']['name']}-{role.lower()}"}, "template": spec["template"]}
            for role, spec in manifest["spec"]["pytorchReplicaSpecs"].items()]
