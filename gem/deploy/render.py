"""The files under deploy/, rendered from a config (configs/demo.yaml by default), the stage registry and
the project's pins; `python -m gem.deploy render` writes them, and tests/unit/test_deploy.py checks
that the committed files equal a fresh render and validates them.

    deploy/Dockerfile                  the image every service and job runs (pins: requirements.txt)
    deploy/compose.yaml                `make cluster-demo`'s topology as containers (compose_file)
    deploy/compose/gem.yaml            the config the compose services read
    deploy/compose/secrets/.gitignore  keeps the local secrets (`python -m gem.deploy local-secrets`) out of git
    deploy/k8s/gem-config.yaml         the ConfigMap of the config every pod reads
    deploy/k8s/rbac.yaml               what Airflow's workers may do in the jobs' namespace
    deploy/k8s/airflow-values.yaml     values for the official Airflow Helm chart (AIRFLOW_CHART_VERSION)
    deploy/k8s/spark/<stage>.yaml      a SparkApplication per Spark stage (SPARK_OPERATOR_VERSION)
    deploy/k8s/training/<stage>.yaml   a PyTorchJob per torch stage (TRAINING_OPERATOR_VERSION)

Credentials are never written: compose reads them from files under deploy/compose/secrets/ (compose
`secrets`, Airflow's `_CMD` settings, an env file), Kubernetes from Secrets (secretKeyRef and the
chart's *SecretName values).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gem.config import REPO_ROOT, GemConfig, load_config
from gem.deploy import manifests
from gem.lakehouse.stages import GPU_POOL, STAGES
from gem.pipeline.airflow.orchestration import DAY_EXPR, FROM_STAGE_EXPR, GPU_POOL_SLOTS, LAUNCHED_STAGES
from gem.pipeline.services import LOCAL_S3_REGION

DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.yaml"
DEFAULT_OUT = REPO_ROOT / "deploy"
BUCKET = "gem-demo"
# The versions the files are written for (docs/cluster.md): no package ships these charts' or
# operators' schemas, so tests check the keys set.
AIRFLOW_CHART_VERSION = "1.22.0"
SPARK_OPERATOR_VERSION = "2.3.0"
TRAINING_OPERATOR_VERSION = "1.9.2"
KUBERNETES_VERSION = "1.37.0"  # the API schemas kubernetes-validate checks the core kinds against
# Images besides the project's own.
POSTGRES_IMAGE = "postgres:17"
REDIS_IMAGE = "redis:7.4"
MAVEN_IMAGE = "maven:3.9-eclipse-temurin-17"
# The compose topology: `make cluster-demo`'s services (gem.pipeline.cluster_demo, gem.pipeline.services).
SPARK_WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "2g"
CELERY_WORKERS = 2
S3_PORT = 5000
SPARK_PORT = 7077
SPARK_UI_PORT = 8081
API_PORT = 8080
AIRFLOW_HOME = "/opt/airflow"
AIRFLOW_DB = "airflow"
OBJECT_STORE_CONN = "gem_object_store"
# The Helm release Airflow is installed as: its workers run as the service account <release>-worker.
HELM_RELEASE = "airflow"
LAUNCHER_ROLE = "gem-launcher"
# Compose's local secrets: one file each, read by the services as /run/secrets/<name>.
COMPOSE_SECRETS = ("postgres_password", "redis_password", "airflow_db_url", "celery_broker_url",
                   "celery_result_backend", "airflow_fernet_key", "airflow_jwt_secret", "airflow_api_secret_key")
OBJECT_STORE_ENV_FILE = "object-store.env"
SECRETS_DIR = "compose/secrets"
# The Airflow settings read from a secret file (Airflow's `_CMD` form of a sensitive setting).
SECRET_SETTINGS = {
    ("database", "sql_alchemy_conn"): "airflow_db_url",
    ("celery", "broker_url"): "celery_broker_url",
    ("celery", "result_backend"): "celery_result_backend",
    ("core", "fernet_key"): "airflow_fernet_key",
    ("api_auth", "jwt_secret"): "airflow_jwt_secret",
    ("api", "secret_key"): "airflow_api_secret_key",
}
# The Helm chart's Secrets, by the values key that names each (the keys inside them are the chart's).
CHART_SECRETS = {
    "fernetKeySecretName": "gem-airflow-fernet-key",
    "apiSecretKeySecretName": "gem-airflow-api-secret-key",
    "jwtSecretName": "gem-airflow-jwt-secret",
}
CHART_DATA_SECRETS = {
    "metadataSecretName": "gem-airflow-metadata",
    "resultBackendSecretName": "gem-airflow-result-backend",
    "brokerUrlSecretName": "gem-airflow-broker-url",
}
CHART_REDIS_SECRET = "gem-airflow-redis-password"


def header(config: str, what: str) -> str:
    return (f"# {what}\n# Rendered by `python -m gem.deploy render` from {config} and the stage registry "
            "(gem/deploy/): edit those and render again; tests/unit/test_deploy.py checks this file equals "
            "a fresh render.\n")


class _Dumper(yaml.SafeDumper):
    """Block YAML without anchors; a string holding Jinja ({{ }}) double-quoted, so the operators'
    Jinja renders the text as written; a multi-line string as a literal block."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if "{{" in value else "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump(*documents: Any) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False)


def pinned(path: Path, name: str) -> str:
    """The version `name==V` pins in a requirements file (or the Makefile's pip pin)."""
    found = re.search(rf"(?mi)\b{re.escape(name)}==([^\s\"]+)", path.read_text())
    if found is None:
        raise ValueError(f"{path} pins no {name}")
    return found.group(1)


# --------------------------------------------------------------------------------------------------
# The configs the deployments read.


def on_object_store(base: Mapping[str, Any], bucket: str) -> dict[str, Any]:
    """`base` (a config file's mapping) with the lakehouse in the bucket, and the landing zone beside
    it where `base` names one."""
    cfg = copy.deepcopy(dict(base))
    cfg["lakehouse_uri"] = f"s3://{bucket}/lakehouse"
    if cfg.get("landing_uri"):
        cfg["landing_uri"] = f"s3://{bucket}/landing"
    return cfg


def compose_config(base: Mapping[str, Any], bucket: str) -> dict[str, Any]:
    """The compose services' config: `base` on the object store, Spark on the compose master with one
    executor per worker."""
    cfg = on_object_store(base, bucket)
    spark = dict(cfg.get("spark") or {})
    spark["master"] = f"spark://spark-master:{SPARK_PORT}"
    spark["conf"] = {**spark.get("conf", {}), "spark.executor.cores": str(WORKER_CORES),
                     "spark.executor.memory": WORKER_MEMORY, "spark.cores.max": str(SPARK_WORKERS * WORKER_CORES)}
    cfg["spark"] = spark
    return cfg


def cluster_config(base: Mapping[str, Any], bucket: str) -> dict[str, Any]:
    """The Kubernetes deployment's config: `base` on the object store, the model stages launched as
    cluster jobs (the other stages run in Airflow's worker pods, with `base`'s Spark master)."""
    cfg = on_object_store(base, bucket)
    cfg["launcher"] = {**(cfg.get("launcher") or {}), "kind": "cluster_job"}
    return cfg


def checked(data: Mapping[str, Any], what: str) -> GemConfig:
    """The config `data` makes (defaults for the rest, no environment), validated."""
    try:
        return load_config(overrides=data, environ={})
    except ValueError as error:
        raise ValueError(f"the {what} config does not validate:\n{error}") from None


def config_text(data: Mapping[str, Any], config: str, what: str) -> str:
    return header(config, what) + yaml.safe_dump(dict(data), sort_keys=False, width=1000)


# --------------------------------------------------------------------------------------------------
# Airflow's settings, shared by compose (variables) and the Helm chart (its `config`).


def airflow_settings(bucket: str) -> dict[tuple[str, str], str]:
    """(section, key) -> value of the Airflow settings both deployments set: the CeleryExecutor, the
    DAGs in the image, task logs on the object store through OBJECT_STORE_CONN."""
    return {
        ("core", "executor"): "CeleryExecutor",
        ("core", "dags_folder"): f"{manifests.IMAGE_ROOT}/dags",
        ("core", "load_examples"): "False",
        ("core", "default_timezone"): "utc",
        ("celery", "worker_concurrency"): "1",
        ("logging", "remote_logging"): "True",
        ("logging", "remote_base_log_folder"): f"s3://{bucket}/airflow-logs",
        ("logging", "remote_log_conn_id"): OBJECT_STORE_CONN,
    }


def airflow_variable(section: str, key: str) -> str:
    return f"AIRFLOW__{section.upper()}__{key.upper()}"


def connection_variable(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def object_store_connection(endpoint: str | None) -> str:
    """OBJECT_STORE_CONN as JSON: an AWS connection without credentials (boto takes them from the
    AWS variables the secret sets), with the endpoint of an S3 API other than AWS's."""
    extra = {"endpoint_url": endpoint} if endpoint else {}
    return json.dumps({"conn_type": "aws", "extra": extra})


# --------------------------------------------------------------------------------------------------
# Compose.


def _healthcheck(test: list[str]) -> dict[str, Any]:
    return {"test": test, "interval": "10s", "timeout": "5s", "retries": 12, "start_period": "10s"}


def _http_check(url: str) -> dict[str, Any]:
    return _healthcheck(["CMD", "python", "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=4)"])


def compose_file(cfg: GemConfig, bucket: str) -> dict[str, Any]:
    """The compose project: the S3 API server (moto) with the bucket, Postgres, Redis, the Airflow
    API server, scheduler, DAG processor and CELERY_WORKERS Celery workers, a Spark master and
    SPARK_WORKERS workers; every project service runs the image deploy/Dockerfile builds."""
    image = cfg.launcher.image
    build = {"context": "..", "dockerfile": "deploy/Dockerfile"}
    s3 = f"http://s3:{S3_PORT}"
    gem_env = {
        "GEM_CONFIG": f"{manifests.CONFIG_DIR}/{manifests.CONFIG_KEY}",
        "AWS_ENDPOINT_URL": s3, "AWS_REGION": LOCAL_S3_REGION, "AWS_DEFAULT_REGION": LOCAL_S3_REGION,
        "AWS_ALLOW_HTTP": "true",
    }
    gem_service = {
        "image": image, "build": build,
        "env_file": [{"path": f"./{SECRETS_DIR}/{OBJECT_STORE_ENV_FILE}", "required": True}],
        "configs": [{"source": "gem_config", "target": f"{manifests.CONFIG_DIR}/{manifests.CONFIG_KEY}"}],
    }
    airflow_env = {
        **gem_env,
        **{airflow_variable(s, k): v for (s, k), v in airflow_settings(bucket).items()},
        **{airflow_variable(s, k) + "_CMD": f"cat /run/secrets/{name}" for (s, k), name in SECRET_SETTINGS.items()},
        airflow_variable("core", "execution_api_server_url"): f"http://airflow-api-server:{API_PORT}/execution/",
        airflow_variable("core", "auth_manager"):
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        airflow_variable("core", "simple_auth_manager_users"): "admin:admin",
        airflow_variable("core", "simple_auth_manager_all_admins"): "False",
        connection_variable(OBJECT_STORE_CONN): object_store_connection(s3),
    }
    airflow_secrets = list(SECRET_SETTINGS.values())
    initialised = {"airflow-init": {"condition": "service_completed_successfully"}}

    def airflow(command: list[str], **extra: Any) -> dict[str, Any]:
        return {**gem_service, "command": command, "environment": airflow_env, "secrets": airflow_secrets,
                "depends_on": {**initialised, "redis": {"condition": "service_healthy"},
                               "s3-bucket": {"condition": "service_completed_successfully"}},
                "restart": "unless-stopped", **extra}

    services: dict[str, Any] = {
        "s3": {"image": image, "build": build,
               "command": ["python", "-m", "gem.pipeline.local_s3_server", "-H", "0.0.0.0", "-p", str(S3_PORT)],
               "healthcheck": _http_check(f"http://127.0.0.1:{S3_PORT}/moto-api/"), "restart": "unless-stopped"},
        "s3-bucket": {**gem_service, "environment": gem_env,
                      "command": ["python", "-c", f"from gem import storage; storage.filesystem('s3://').mkdir({bucket!r})"],
                      "depends_on": {"s3": {"condition": "service_healthy"}}},
        "postgres": {
            "image": POSTGRES_IMAGE,
            "environment": {"POSTGRES_USER": AIRFLOW_DB, "POSTGRES_DB": AIRFLOW_DB,
                            "POSTGRES_PASSWORD_FILE": "/run/secrets/postgres_password"},
            "secrets": ["postgres_password"],
            "volumes": ["postgres-data:/var/lib/postgresql/data"],
            "healthcheck": _healthcheck(["CMD", "pg_isready", "-U", AIRFLOW_DB, "-d", AIRFLOW_DB]),
            "restart": "unless-stopped",
        },
        "redis": {
            "image": REDIS_IMAGE,
            # No persistence: the broker's queue is rebuilt by the scheduler.
            "command": ["sh", "-c", ('exec redis-server --save "" --appendonly no '
                                    '--requirepass "$$(cat /run/secrets/redis_password)"')],
            "secrets": ["redis_password"],
            "healthcheck": _healthcheck(["CMD-SHELL", ('redis-cli -a "$$(cat /run/secrets/redis_password)" '
                                                      "--no-auth-warning ping | grep -q PONG")]),
            "restart": "unless-stopped",
        },
        "airflow-init": {
            **gem_service, "environment": airflow_env, "secrets": airflow_secrets,
            "command": ["bash", "-c", (f"airflow db migrate && airflow pools set {GPU_POOL} {GPU_POOL_SLOTS} "
                                      "'GPU slots for the model stages'")],
            "depends_on": {"postgres": {"condition": "service_healthy"}},
        },
        "airflow-api-server": airflow(["airflow", "api-server", "--port", str(API_PORT)],
                                      ports=[f"127.0.0.1:{API_PORT}:{API_PORT}"],
                                      healthcheck=_http_check(f"http://127.0.0.1:{API_PORT}/api/v2/monitor/health")),
        "airflow-scheduler": airflow(["airflow", "scheduler"]),
        "airflow-dag-processor": airflow(["airflow", "dag-processor"]),
    }
    for i in range(1, CELERY_WORKERS + 1):
        # Its hostname is the one the Spark executors reach its driver at.
        services[f"airflow-worker-{i}"] = airflow(["airflow", "celery", "worker", "--queues", "default"],
                                                  hostname=f"airflow-worker-{i}")
    services["spark-master"] = {
        **gem_service, "environment": gem_env, "hostname": "spark-master",
        "command": ["spark-class", "org.apache.spark.deploy.master.Master", "--host", "spark-master",
                    "--port", str(SPARK_PORT), "--webui-port", str(SPARK_UI_PORT)],
        "healthcheck": _http_check(f"http://127.0.0.1:{SPARK_UI_PORT}/json/"),
        "restart": "unless-stopped",
    }
    for i in range(1, SPARK_WORKERS + 1):
        # The executors inherit the worker's environment: the object store's variables.
        services[f"spark-worker-{i}"] = {
            **gem_service, "environment": gem_env, "hostname": f"spark-worker-{i}",
            "command": ["spark-class", "org.apache.spark.deploy.worker.Worker", f"spark://spark-master:{SPARK_PORT}",
                        "--host", f"spark-worker-{i}", "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                        "--work-dir", "/tmp/spark-work"],
            "depends_on": {"spark-master": {"condition": "service_healthy"}},
            "restart": "unless-stopped",
        }
    return {
        "name": "gem",
        "services": services,
        "configs": {"gem_config": {"file": "./compose/gem.yaml"}},
        "secrets": {name: {"file": f"./{SECRETS_DIR}/{name}"} for name in COMPOSE_SECRETS},
        "volumes": {"postgres-data": {}},
    }


# --------------------------------------------------------------------------------------------------
# Kubernetes.


def config_map(config: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": manifests.CONFIG_MAP, "labels": {"app.kubernetes.io/part-of": manifests.PART_OF}},
            "data": {manifests.CONFIG_KEY: config}}


def launcher_rbac(namespace: str) -> list[dict[str, Any]]:
    """A Role letting Airflow's workers submit and follow the cluster jobs in `namespace`, bound to
    the chart's worker service account."""
    rules = [
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs", "pytorchjobs/status"],
         "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": ["sparkoperator.k8s.io"], "resources": ["sparkapplications", "sparkapplications/status"],
         "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": ["get", "list", "watch", "patch"]},
    ]
    meta = {"name": LAUNCHER_ROLE, "namespace": namespace}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "subjects": [{"kind": "ServiceAccount", "name": f"{HELM_RELEASE}-worker", "namespace": namespace}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LAUNCHER_ROLE}},
    ]


def airflow_values(cfg: GemConfig, bucket: str) -> dict[str, Any]:
    """Values for the official Airflow chart: this project's image, the CeleryExecutor with the
    chart's Redis as broker, an external Postgres as metadata DB, task logs on the object store;
    every credential a Secret the chart's *SecretName values name; the config from the ConfigMap."""
    repository, _, tag = cfg.launcher.image.rpartition(":")
    config: dict[str, dict[str, str]] = {}
    for (section, key), value in airflow_settings(bucket).items():
        config.setdefault(section, {})[key] = value
    launcher = cfg.launcher
    return {
        "airflowVersion": pinned(REPO_ROOT / "requirements.txt", "apache-airflow"),
        "defaultAirflowRepository": repository,
        "defaultAirflowTag": tag,
        "images": {"airflow": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}},
        "executor": "CeleryExecutor",
        "uid": 50000,
        "gid": 0,
        **CHART_SECRETS,
        "data": dict(CHART_DATA_SECRETS),
        "postgresql": {"enabled": False},
        "redis": {"enabled": True, "passwordSecretName": CHART_REDIS_SECRET},
        "workers": {"replicas": CELERY_WORKERS},
        "scheduler": {"replicas": 1},
        "dagProcessor": {"enabled": True},
        "apiServer": {"replicas": 1},
        "triggerer": {"enabled": False},
        "dags": {"persistence": {"enabled": False}, "gitSync": {"enabled": False}},
        "logs": {"persistence": {"enabled": False}},
        "config": config,
        "env": [
            {"name": "GEM_CONFIG", "value": f"{manifests.CONFIG_DIR}/{manifests.CONFIG_KEY}"},
            {"name": connection_variable(OBJECT_STORE_CONN), "value": object_store_connection(None)},
            {"name": connection_variable(launcher.kubernetes_conn_id),
             "value": json.dumps({"conn_type": "kubernetes",
                                  "extra": {"in_cluster": True, "namespace": launcher.namespace}})},
        ],
        "secret": [{"envName": key, "secretName": manifests.OBJECT_STORE_SECRET, "secretKey": key}
                   for key in manifests.REQUIRED_SECRET_KEYS],
        "volumes": [manifests.config_volume()],
        "volumeMounts": [manifests.config_mount()],
    }


# --------------------------------------------------------------------------------------------------
# The image.


def dockerfile(config: str) -> str:
    """deploy/Dockerfile: Python IMAGE_PYTHON with Java 17, every package pinned in requirements.txt
    (pip at the Makefile's pin), the Delta and S3A jars from Maven as `make setup` fetches them,
    Spark's container entry point (apache/spark at pyspark's pin) for the Spark operator's pods,
    the offline Data Docs assets, and the checkout at manifests.IMAGE_ROOT."""
    py = manifests.IMAGE_PYTHON
    pip = pinned(REPO_ROOT / "Makefile", "pip")
    spark = pinned(REPO_ROOT / "requirements.txt", "pyspark")
    root = manifests.IMAGE_ROOT
    return "".join([
        "# syntax=docker/dockerfile:1\n",
        header(config, "The image of every service and job (docs/cluster.md); build from the repository root:\n"
                       "#   docker build -f deploy/Dockerfile -t gem-pipeline:latest ."),
        "\n# The Delta Lake and S3A jars, fetched as `make setup` fetches them.\n",
        f"FROM {MAVEN_IMAGE} AS jars\n",
        "COPY infra/delta-jars/pom.xml /build/pom.xml\n",
        ("RUN mvn -q -B -f /build/pom.xml dependency:copy-dependencies -DincludeScope=runtime "
        "-DoutputDirectory=/build/jars\n"),
        "\n# Spark's container entry point: the Spark operator starts drivers and executors through it.\n",
        f"FROM apache/spark:{spark} AS spark\n",
        f"\nFROM python:{py}-slim-bookworm\n",
        "# Optional: PyTorch's CPU wheel index, for the small CPU-only torch build (as `make setup`).\n",
        "ARG TORCH_INDEX_URL=\n",
        "ENV PYTHONUNBUFFERED=1 \\\n    PIP_NO_CACHE_DIR=1 \\\n    PIP_DISABLE_PIP_VERSION_CHECK=1 \\\n",
        f"    AIRFLOW_HOME={AIRFLOW_HOME} \\\n    PYTHONPATH={root} \\\n",
        f"    SPARK_HOME=/usr/local/lib/python{py}/site-packages/pyspark \\\n",
        "    PYSPARK_PYTHON=/usr/local/bin/python\n",
        "ENV PATH=${SPARK_HOME}/bin:${PATH}\n",
        "RUN apt-get update \\\n",
        " && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps \\\n",
        " && rm -rf /var/lib/apt/lists/*\n",
        f"WORKDIR {root}\n",
        "COPY requirements.txt requirements-nodeps.txt pyproject.toml ./\n",
        f"RUN python -m pip install --upgrade pip=={pip} \\\n",
        (' && if [ -n "$TORCH_INDEX_URL" ]; then python -m pip install '
        '"torch==$(sed -n \'s/^torch==//p\' requirements.txt)" --index-url "$TORCH_INDEX_URL"; fi \\\n'),
        " && python -m pip install -r requirements.txt \\\n",
        " && python -m pip install --no-deps -r requirements-nodeps.txt\n",
        "COPY --from=jars /build/jars .cache/jars\n",
        "COPY --from=spark /opt/entrypoint.sh /opt/decom.sh /opt/\n",
        *(f"COPY {folder} {folder}\n" for folder in ("gem", "jobs", "schemas", "dags", "configs", "infra")),
        "# The checkout itself (the `gem` command), the pins checked, the Data Docs assets (npm only for that).\n",
        "RUN python -m pip install --no-deps --no-build-isolation -e . \\\n",
        " && bash infra/pip_check.sh python \\\n",
        " && apt-get update && apt-get install -y --no-install-recommends npm \\\n",
        " && PYTHON=python bash infra/dq_assets/fetch.sh .cache/dq_assets \\\n",
        " && apt-get purge -y --auto-remove npm && rm -rf /var/lib/apt/lists/* /root/.npm \\\n",
        " && useradd --uid 50000 --gid 0 --create-home gem \\\n",
        ' && mkdir -p "$AIRFLOW_HOME" && chown -R 50000:0 "$AIRFLOW_HOME"\n',
        "USER 50000\n",
        'ENTRYPOINT ["/opt/entrypoint.sh"]\n',
    ])


# --------------------------------------------------------------------------------------------------
# Everything.


def relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def render(config: Path = DEFAULT_CONFIG, bucket: str = BUCKET) -> dict[str, str]:
    """deploy/'s files (path under deploy/ -> text) for the config file `config` and the bucket."""
    base = yaml.safe_load(config.read_text()) or {}
    name = relative(config)
    compose_data, cluster_data = compose_config(base, bucket), cluster_config(base, bucket)
    compose_cfg, cfg = checked(compose_data, "compose"), checked(cluster_data, "cluster")
    cluster_text = config_text(cluster_data, name, "The config of the Kubernetes deployment (gem/deploy/render.py).")
    files = {
        "Dockerfile": dockerfile(name),
        "compose.yaml": header(name, "`make cluster-demo`'s topology as containers: `docker compose -f deploy/compose.yaml "
                                     "up` after `python -m gem.deploy local-secrets`.") + dump(compose_file(compose_cfg, bucket)),
        "compose/gem.yaml": config_text(compose_data, name, "The config of the compose services (gem/deploy/render.py)."),
        "compose/secrets/.gitignore": "# The local secrets `python -m gem.deploy local-secrets` writes stay out of git.\n"
                                      "*\n!.gitignore\n",
        "k8s/gem-config.yaml": header(name, "The ConfigMap of the config every pod reads.") + dump(config_map(cluster_text)),
        "k8s/rbac.yaml": header(name, "What Airflow's workers may do in the jobs' namespace.")
        + dump(*launcher_rbac(cfg.launcher.namespace)),
        "k8s/airflow-values.yaml": header(name, f"Values for the official Airflow Helm chart {AIRFLOW_CHART_VERSION}.")
        + dump(airflow_values(cfg, bucket)),
    }
    for stage in STAGES:
        if stage.spark:
            what = (f"The SparkApplication of {stage.name} (Spark operator {SPARK_OPERATOR_VERSION}); its Jinja "
                    "renders per DAG run (SparkKubernetesOperator).")
            files[f"k8s/spark/{stage.name}.yaml"] = header(name, what) + dump(
                manifests.spark_application(stage, cfg.launcher, cfg.spark, DAY_EXPR, FROM_STAGE_EXPR))
        elif stage.name in LAUNCHED_STAGES:
            what = (f"The PyTorchJob of {stage.name} (Kubeflow training operator {TRAINING_OPERATOR_VERSION}); its "
                    "Jinja renders per DAG run (gem.deploy.operators.PyTorchJobOperator).")
            files[f"k8s/training/{stage.name}.yaml"] = header(name, what) + dump(
                manifests.pytorch_job(stage, cfg.launcher, DAY_EXPR, FROM_STAGE_EXPR))
    return files


def write(files: Mapping[str, str], out: Path) -> list[Path]:
    """Write the rendered files under `out` -> their paths."""
    written = []
    for rel, text in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def local_secrets() -> dict[str, str]:
    """New random values for compose's secrets (file name -> text): the Postgres and Redis passwords
    and the URLs that carry them, Airflow's keys, and the S3 API server's stand-in credentials."""
    postgres, redis = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    return {
        "postgres_password": postgres,
        "redis_password": redis,
        "airflow_db_url": f"postgresql+psycopg2://{AIRFLOW_DB}:{postgres}@postgres:5432/{AIRFLOW_DB}",
        "celery_broker_url": f"redis://:{redis}@redis:6379/0",
        "celery_result_backend": f"redis://:{redis}@redis:6379/1",
        "airflow_fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "airflow_jwt_secret": secrets.token_urlsafe(48),
        "airflow_api_secret_key": secrets.token_urlsafe(48),
        OBJECT_STORE_ENV_FILE: "".join(f"{key}={secrets.token_hex(16)}\n" for key in manifests.REQUIRED_SECRET_KEYS),
    }


def write_local_secrets(folder: Path) -> list[Path]:
    """Write `local_secrets` into `folder`, each file readable by its owner only; refuses when any
    exists (a running compose project uses them)."""
    values = local_secrets()
    existing = [folder / name for name in values if (folder / name).exists()]
    if existing:
        raise FileExistsError(f"secrets exist already, not replaced: {', '.join(map(str, existing))}")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, value in values.items():
        path = folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        written.append(path)
    return written
