"""deploy/'s files: equal to a fresh render (gem.deploy.render), valid against the schemas pinned
packages ship (the compose specification's, vendored by check-jsonschema; the Kubernetes API's, by
kubernetes-validate), the keys of the kinds no package has a schema for (the Airflow chart's values,
the Spark and training operators' custom resources), no credential written into any of them, and an
image file whose COPY sources exist and whose pins are the project's. Then the DAG's launchers:
the cluster-job DAG's operators and the manifests they render, the torchrun task, the launched
process's outcome."""

from __future__ import annotations

import copy
import datetime as dt
import importlib.resources
import json
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gem.config import REPO_ROOT, load_config
from gem.deploy import manifests, render
from gem.lakehouse import stages
from gem.pipeline.airflow import orchestration
from gem.pipeline.services import LOCAL_S3_CREDENTIALS

# Airflow keeps its config in the repo's gitignored .airflow (as tests/dags do).
os.environ.setdefault("AIRFLOW_HOME", str(REPO_ROOT / ".airflow"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

DEPLOY = REPO_ROOT / "deploy"
SECRETS = DEPLOY / render.SECRETS_DIR
SPARK_STAGES = {s.name for s in stages.STAGES if s.spark}
TORCH_JOBS = {"pretrain", "distill"}
# A variable or key naming a credential.
SENSITIVE = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|FERNET|CONN$|_URL_CMD$|BROKER|RESULT_BACKEND", re.IGNORECASE)
# user:password@ in a URL.
URL_CREDENTIALS = re.compile(r"://[^/\s:@'\"]*:[^@\s'\"/]+@")


def _documents(rel: str) -> list[Any]:
    return [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d is not None]


def _cluster_config() -> Any:
    """The config the Kubernetes deployment runs: the committed ConfigMap's."""
    (config_map,) = _documents("k8s/gem-config.yaml")
    return load_config(overrides=yaml.safe_load(config_map["data"][manifests.CONFIG_KEY]), environ={})


def _k8s_valid(resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, render.KUBERNETES_VERSION, strict=True)


def test_the_committed_files_equal_a_fresh_render() -> None:
    files = render.render()
    committed = {str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*")
                 if p.is_file() and (p.parent != SECRETS or p.name == ".gitignore")}
    assert committed == set(files), "run `python -m gem.deploy render`"
    stale = [rel for rel, text in files.items() if (DEPLOY / rel).read_text() != text]
    assert stale == [], f"stale: {stale}; run `python -m gem.deploy render`"
    assert {f"k8s/spark/{s}.yaml" for s in SPARK_STAGES} | {f"k8s/training/{s}.yaml" for s in TORCH_JOBS} <= set(files)


def test_the_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads(importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
                        .joinpath("compose-spec.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    (compose,) = _documents("compose.yaml")
    assert list(validator.iter_errors(compose)) == []
    broken = copy.deepcopy(compose)
    broken["services"]["s3-bucket"]["depends_on"]["s3"]["condition"] = "service_ready"
    broken["services"]["postgres"]["restarts"] = "always"
    rejected = " ".join(error.message for error in validator.iter_errors(broken))
    assert "'service_ready'" in rejected and "'restarts'" in rejected  # the schema rejects what it should
    # The cluster demo's topology, and every secret, config and build file a service names exists.
    services = compose["services"]
    assert set(services) == {"s3", "s3-bucket", "postgres", "redis", "airflow-init", "airflow-api-server",
                             "airflow-scheduler", "airflow-dag-processor", "airflow-worker-1", "airflow-worker-2",
                             "spark-master", "spark-worker-1", "spark-worker-2"}
    assert services["airflow-worker-1"]["command"][:3] == ["airflow", "celery", "worker"]
    assert services["spark-worker-2"]["command"][2] == services["spark-worker-1"]["command"][2] == "spark://spark-master:7077"
    for name, service in services.items():
        assert set(service.get("secrets", [])) <= set(compose["secrets"]), name
        if "build" in service:
            assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    assert set(compose["secrets"]) == set(render.COMPOSE_SECRETS)
    assert (DEPLOY / compose["configs"]["gem_config"]["file"]).is_file()
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD"] == "cat /run/secrets/airflow_db_url"
    compose_cfg = load_config(overrides=yaml.safe_load((DEPLOY / "compose/gem.yaml").read_text()), environ={})
    assert compose_cfg.spark.master == "spark://spark-master:7077"
    assert compose_cfg.lakehouse_uri == f"s3://{render.BUCKET}/lakehouse"


def test_the_kubernetes_core_kinds_follow_the_api_schema() -> None:
    core = _documents("k8s/gem-config.yaml") + _documents("k8s/rbac.yaml")
    assert [r["kind"] for r in core] == ["ConfigMap", "Role", "RoleBinding"]
    for resource in core:
        _k8s_valid(resource)
    for name in TORCH_JOBS:
        (job,) = _documents(f"k8s/training/{name}.yaml")
        for template in manifests.pod_templates(job):
            _k8s_valid(template)
    broken = manifests.pod_templates(_documents("k8s/training/pretrain.yaml")[0])[0]
    broken["template"]["spec"]["containers"][0]["env"][0]["valueFrom"] = {"secretKeyRef": {"key": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        _k8s_valid(broken)


def test_the_operator_resources_and_the_chart_values_set_their_keys() -> None:
    """No package ships the Spark operator's, the training operator's or the Airflow chart's schema
    (docs/cluster.md names the versions written for): the keys they need are checked here."""
    pyspark = render.pinned(REPO_ROOT / "requirements.txt", "pyspark")
    for name in SPARK_STAGES:
        (app,) = _documents(f"k8s/spark/{name}.yaml")
        spec = app["spec"]
        assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication")
        assert (spec["type"], spec["mode"], spec["sparkVersion"]) == ("Python", "cluster", pyspark)
        main_file = spec["mainApplicationFile"].removeprefix(f"local://{manifests.IMAGE_ROOT}/")
        assert (REPO_ROOT / main_file).is_file()
        assert spec["arguments"][:4] == ["--stage", name, "--run-day", orchestration.DAY_EXPR]
        assert spec["sparkConf"]["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
        assert "spark.jars.packages" not in spec["sparkConf"]
        for role in ("driver", "executor"):
            assert {"cores", "memory", "env", "volumeMounts"} <= set(spec[role]), (name, role)
    for name in TORCH_JOBS:
        (job,) = _documents(f"k8s/training/{name}.yaml")
        assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
        policy = job["spec"]["elasticPolicy"]
        assert policy["rdzvBackend"] == "c10d" and policy["minReplicas"] <= policy["maxReplicas"]
        (worker,) = job["spec"]["pytorchReplicaSpecs"].values()
        assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]  # elastic jobs have workers only
        assert worker["replicas"] == policy["maxReplicas"]
        (container,) = worker["template"]["spec"]["containers"]
        assert container["name"] == "pytorch" and container["command"] == ["torchrun"]
        args = container["args"]
        assert "--rdzv-backend=c10d" in args and f"--nproc-per-node={policy['nProcPerNode']}" in args
        assert f"--rdzv-endpoint={job['metadata']['name']}-worker-0:{manifests.RDZV_PORT}" in args
        assert args[args.index("-m") + 1:args.index("-m") + 4] == ["gem.deploy.launch", "--stage", name]
    (values,) = _documents("k8s/airflow-values.yaml")
    assert values["executor"] == "CeleryExecutor"
    assert values["airflowVersion"] == render.pinned(REPO_ROOT / "requirements.txt", "apache-airflow")
    assert values["postgresql"] == {"enabled": False} and set(values["data"]) == {
        "metadataSecretName", "resultBackendSecretName", "brokerUrlSecretName"}
    assert values["redis"]["enabled"] is True and values["redis"]["passwordSecretName"]
    assert {"fernetKeySecretName", "apiSecretKeySecretName", "jwtSecretName"} <= set(values)
    assert values["config"]["logging"]["remote_logging"] == "True"
    assert values["config"]["logging"]["remote_base_log_folder"].startswith("s3://")
    assert values["workers"]["replicas"] == 2 and values["dagProcessor"]["enabled"] is True


def _env_entries(node: Any) -> list[tuple[str, Any]]:
    """Every variable the files set: (name, its entry): compose `environment` mappings, Kubernetes
    `env` lists and the chart's `env` list."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "environment" and isinstance(value, dict):
                found += [(k, v) for k, v in value.items()]
            elif key == "env" and isinstance(value, list):
                found += [(e["name"], e) for e in value]
            else:
                found += _env_entries(value)
    elif isinstance(node, list):
        for item in node:
            found += _env_entries(item)
    return found


def test_no_credential_is_written_into_a_deployment_file() -> None:
    """Passwords, keys and URLs that carry them are references: compose reads secret files
    (`_FILE`, Airflow's `_CMD`, an env file that is never committed), Kubernetes reads Secrets."""
    texts = {p: p.read_text() for p in DEPLOY.rglob("*") if p.is_file() and p.parent != SECRETS}
    documents = [d for p, t in texts.items() if p.suffix == ".yaml" for d in yaml.safe_load_all(t) if d is not None]
    entries = _env_entries(documents)
    assert len(entries) > 50
    for name, entry in entries:
        if not SENSITIVE.search(name):
            continue
        if isinstance(entry, dict):  # Kubernetes: a reference to a Secret's key, never a value
            assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], name
        elif name.startswith("AIRFLOW_CONN_"):
            assert "login" not in json.loads(entry) and "password" not in json.loads(entry), name
        else:  # compose: a file the secret is read from
            assert name.endswith(("_FILE", "_CMD")) and "/run/secrets/" in entry, name
    for path, text in texts.items():
        assert not URL_CREDENTIALS.search(text), path
        assert not any(value in text for value in LOCAL_S3_CREDENTIALS.values()), path
    assert "*" in (SECRETS / ".gitignore").read_text().split()
    made = render.local_secrets()
    assert set(render.COMPOSE_SECRETS) | {render.OBJECT_STORE_ENV_FILE} == set(made)
    assert not any(value.strip() in text for value in made.values() for text in texts.values())


def test_local_secrets_are_owner_only_and_never_replaced(tmp_path: Path) -> None:
    written = render.write_local_secrets(tmp_path)
    assert {p.name for p in written} == set(render.COMPOSE_SECRETS) | {render.OBJECT_STORE_ENV_FILE}
    assert {p.stat().st_mode & 0o777 for p in written} == {0o600}
    before = (tmp_path / "postgres_password").read_text()
    assert before in (tmp_path / "airflow_db_url").read_text()
    with pytest.raises(FileExistsError, match="not replaced"):
        render.write_local_secrets(tmp_path)
    assert (tmp_path / "postgres_password").read_text() == before


def test_the_image_file_copies_what_exists_and_pins_what_the_project_pins() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    copies = [line.split()[1:-1] for line in lines if line.startswith("COPY ") and "--from=" not in line]
    assert copies and all((REPO_ROOT / source).exists() for sources in copies for source in sources), copies
    makefile = REPO_ROOT / "Makefile"
    assert f"pip=={render.pinned(makefile, 'pip')} " in text
    python = re.search(r"PYTHON_BOOT \?= python(\S+)", makefile.read_text()).group(1)
    assert f"FROM python:{python}-" in text and python == manifests.IMAGE_PYTHON
    assert f"FROM apache/spark:{render.pinned(REPO_ROOT / 'requirements.txt', 'pyspark')} " in text
    assert "pip install -r requirements.txt" in text and "--no-deps -r requirements-nodeps.txt" in text
    # The only versions it names itself are the ones above: every package comes from requirements.txt.
    assert re.findall(r"\b[\w.-]+==[\w.]+", text) == [f"pip=={render.pinned(makefile, 'pip')}"]


# --------------------------------------------------------------------------------------------------
# The launchers.


def _context(dag: Any, day: str, from_stage: str | None) -> dict[str, Any]:
    conf = {orchestration.FROM_STAGE_CONF: from_stage} if from_stage else None
    return {"data_interval_start": dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC),
            "dag_run": SimpleNamespace(conf=conf), "ti": SimpleNamespace(try_number=1)}


def test_the_cluster_job_dag_submits_the_committed_manifests() -> None:
    """A DAG built with the deployment's config (launcher cluster_job): precompute is the provider's
    SparkKubernetesOperator, pretrain and distill PyTorchJobOperators, each holding the committed
    manifest; rendered for a run, the run's day and from_stage reach the stage's command and the
    pods validate. The other tasks and the graph are the in-process DAG's."""
    from airflow.providers.cncf.kubernetes.operators.custom_object_launcher import CustomObjectLauncher
    from airflow.providers.cncf.kubernetes.operators.resource import KubernetesCreateResourceOperator
    from airflow.providers.cncf.kubernetes.operators.spark_kubernetes import SparkKubernetesOperator
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.serialization.serialized_objects import DagSerialization

    from gem.deploy.operators import PyTorchJobOperator
    from gem.pipeline.airflow.daily_dag import daily_dag

    cfg = _cluster_config()
    assert cfg.launcher.kind == "cluster_job"
    dag = daily_dag("gem_daily_cluster", config=cfg)
    plain = daily_dag("gem_daily_plain", config=load_config(environ={}))
    assert {t.task_id: t.upstream_task_ids for t in dag.tasks} == {t.task_id: t.upstream_task_ids for t in plain.tasks}
    assert {t.task_id: t.pool for t in dag.tasks} == {t.task_id: t.pool for t in plain.tasks}
    for task in dag.tasks:
        if task.task_id in orchestration.LAUNCHED_STAGES:
            assert {a.name for a in task.outlets} == {a.name for a in plain.get_task(task.task_id).outlets}
        elif task.task_id != orchestration.LANDING_SENSOR:
            assert isinstance(task, PythonOperator) and task.python_callable is orchestration.run_stage_task

    # The DAG processor stores it serialized; the operators and their templated manifests survive.
    stored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert "manifest" in stored.get_task("pretrain").template_fields
    precompute = dag.get_task("precompute")
    assert isinstance(precompute, SparkKubernetesOperator)
    assert precompute.template_spec == {"spark": _documents("k8s/spark/precompute.yaml")[0]}
    precompute.render_template_fields(_context(dag, "2026-01-03", None), jinja_env=dag.get_template_env())
    # What the provider's launcher creates from the rendered template.
    app = CustomObjectLauncher(name="gem-precompute-x1", namespace=cfg.launcher.namespace, kube_client=None,
                               custom_obj_api=None, template_body=precompute.template_body).body
    assert (app["kind"], app["metadata"]["name"]) == ("SparkApplication", "gem-precompute-x1")
    assert app["spec"]["arguments"] == ["--stage", "precompute", "--run-day", "2026-01-03", "--from-stage", ""]
    for role in ("driver", "executor"):  # the core fields of its pods, as a v1 PodTemplate
        pod = app["spec"][role]
        _k8s_valid({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"precompute-{role}"},
                    "template": {"spec": {"volumes": app["spec"]["volumes"], "containers": [
                        {"name": role, "image": app["spec"]["image"], "env": pod["env"],
                         "volumeMounts": pod["volumeMounts"]}]}}})

    for name in TORCH_JOBS:
        task = dag.get_task(name)
        assert isinstance(task, PyTorchJobOperator) and isinstance(task, KubernetesCreateResourceOperator)
        assert task.manifest == _documents(f"k8s/training/{name}.yaml")[0]
        assert task.get_namespace() == cfg.launcher.namespace
        task.render_template_fields(_context(dag, "2026-01-03", "pretrain"), jinja_env=dag.get_template_env())
        job = task.manifest
        assert job["metadata"]["name"] == f"gem-{name}-2026-01-03"
        args = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"]
        assert args[-6:] == ["--stage", name, "--run-day", "2026-01-03", "--from-stage", "pretrain"]
        assert f"--rdzv-endpoint=gem-{name}-2026-01-03-worker-0:{manifests.RDZV_PORT}" in args
        for template in manifests.pod_templates(job):
            _k8s_valid(template)


def test_a_pytorchjob_task_waits_for_its_job_and_fails_with_it() -> None:
    from airflow.sdk.exceptions import AirflowException

    from gem.deploy.operators import wait_for_job

    running = {"status": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]}}
    done = {"status": {"conditions": [{"type": "Running", "status": "False"},
                                      {"type": "Succeeded", "status": "True", "message": "all workers done"}]}}
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "message": "worker-1 OOMKilled"}]}}
    states, slept = iter([{}, running, running, done]), []
    assert wait_for_job(lambda: next(states), "gem-pretrain-2026-01-03", 7.0, slept.append) == "all workers done"
    assert slept == [7.0, 7.0, 7.0]
    with pytest.raises(AirflowException, match="gem-pretrain-2026-01-03 failed: worker-1 OOMKilled"):
        wait_for_job(lambda: failed, "gem-pretrain-2026-01-03", 7.0, slept.append)


def test_the_environment_picks_the_launcher_when_the_dag_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    from gem.pipeline.airflow.daily_dag import daily_dag

    monkeypatch.delenv("GEM_CONFIG", raising=False)
    for key in [k for k in os.environ if k.upper().startswith("GEM__")]:
        monkeypatch.delenv(key)
    assert orchestration.parse_config() is None
    assert daily_dag("gem_daily_default").get_task("pretrain").python_callable is orchestration.run_stage_task
    monkeypatch.setenv("GEM__LAUNCHER__KIND", "torchrun")
    dag = daily_dag("gem_daily_torchrun")
    for task in dag.tasks:
        if task.task_id != orchestration.LANDING_SENSOR:
            launched = task.task_id in orchestration.LAUNCHED_STAGES
            assert task.python_callable is (orchestration.run_stage_torchrun if launched else orchestration.run_stage_task)
            assert task.op_kwargs == dag.get_task("mix").op_kwargs | {"stage_name": task.task_id}


def test_the_torchrun_task_launches_its_processes_and_ends_as_rank_0_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_stage_torchrun with torchrun's command stood in for by one that writes a given outcome:
    pretraining gets launcher.nproc_per_node processes, other stages one; the outcome skips,
    reschedules or returns the summary; a failed launch fails the task."""
    from airflow.sdk.exceptions import AirflowRescheduleException, AirflowSkipException

    from gem.deploy import launch

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"lakehouse_uri": str(tmp_path / "lakehouse"),
                                  "launcher": {"kind": "torchrun", "nproc_per_node": 3}}))
    monkeypatch.setenv("GEM_CONFIG", str(config))
    (real,) = launch.torchrun_commands("pretrain", "2026-01-03", "", 3, tmp_path / "o.json")
    assert real[1:3] == ["-m", "torch.distributed.run"] and "--standalone" in real
    assert real[real.index("--nproc-per-node") + 1] == "3" and "gem.deploy.launch" in real
    calls = []

    def launched(outcome: launch.Outcome, code: int = 0) -> None:
        def commands(stage: str, run_day: str, from_stage: str, processes: int, path: Path,
                     nodes: tuple[str, ...]) -> list[list[str]]:
            calls.append((stage, processes, nodes))
            text = json.dumps(outcome.__dict__)
            return [[sys.executable, "-c", f"import pathlib, sys; pathlib.Path({str(path)!r}).write_text({text!r}); sys.exit({code})"]]
        monkeypatch.setattr(launch, "torchrun_commands", commands)

    launched(launch.Outcome("success", "pretrain ds=2026-01-03: 120 steps"))
    assert orchestration.run_stage_torchrun("pretrain", "2026-01-03") == "pretrain ds=2026-01-03: 120 steps"
    launched(launch.Outcome("skipped", "mix: nothing ready on run day 2026-01-03"))
    with pytest.raises(AirflowSkipException, match="mix: nothing ready"):
        orchestration.run_stage_torchrun("mix", "2026-01-03")
    launched(launch.Outcome("rescheduled", "held", "2026-01-04T00:05:00+00:00"))
    with pytest.raises(AirflowRescheduleException) as waiting:
        orchestration.run_stage_torchrun("distill", "2026-01-03")
    assert waiting.value.reschedule_date == dt.datetime(2026, 1, 4, 0, 5, tzinfo=dt.UTC)
    launched(launch.Outcome("success", "never read"), code=1)
    with pytest.raises(RuntimeError, match="torchrun exited with 1"):
        orchestration.run_stage_torchrun("precompute", "2026-01-03")
    assert calls == [("pretrain", 3, ()), ("mix", 1, ()), ("distill", 1, ()), ("precompute", 1, ())]


def test_torchrun_on_local_nodes_meets_at_one_rendezvous_for_pretraining_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With launcher.local_nodes, pretraining launches one torchrun node per address, all at one c10d
    rendezvous hosted by the first; the other launched stages stay one standalone node; a node that
    fails fails the task at once and the nodes still running are stopped."""
    from gem.deploy import launch

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"lakehouse_uri": str(tmp_path / "lakehouse"),
                                  "launcher": {"kind": "torchrun", "local_nodes": ["127.0.0.2", "127.0.0.3"]}}))
    monkeypatch.setenv("GEM_CONFIG", str(config))
    launcher = load_config().launcher
    assert orchestration.stage_nodes("pretrain", launcher) == ("127.0.0.2", "127.0.0.3")
    assert orchestration.stage_nodes("distill", launcher) == ()
    first, second = launch.torchrun_commands("pretrain", "2026-01-03", "", 1, tmp_path / "o.json", ("127.0.0.2", "127.0.0.3"))

    def option(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    assert "--standalone" not in first and option(first, "--nnodes") == option(second, "--nnodes") == "2"
    assert option(first, "--rdzv-endpoint") == option(second, "--rdzv-endpoint")
    assert option(first, "--rdzv-endpoint").startswith("127.0.0.2:") and option(first, "--rdzv-backend") == "c10d"
    assert (option(first, "--local-addr"), option(second, "--local-addr")) == ("127.0.0.2", "127.0.0.3")
    assert (option(first, "--rdzv-conf"), option(second, "--rdzv-conf")) == ("is_host=1", "is_host=0")
    with pytest.raises(ValueError, match="not an IP address"):
        load_config(overrides={"launcher": {"kind": "torchrun", "local_nodes": ["node-a"]}})

    # One node fails while the other would wait for it: the task fails without waiting, the other stopped.
    stopped = tmp_path / "stopped"
    waiting = (f"import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: "
               f"(pathlib.Path({str(stopped)!r}).touch(), sys.exit(143))); time.sleep(600)")
    monkeypatch.setattr(launch, "torchrun_commands", lambda *args: [[sys.executable, "-c", waiting],
                                                                    [sys.executable, "-c", "import sys; sys.exit(3)"]])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"torchrun exited with 143, 3 on 2 nodes"):
        orchestration.run_stage_torchrun("pretrain", "2026-01-03")
    assert time.monotonic() - t0 < 60 and stopped.exists()


def test_the_torchrun_task_runs_the_stage_under_torchrun_and_skips_as_the_in_process_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real torchrun on this host (two ranks), from a task's environment (the metadata DB's URL masked
    as Airflow's task runner masks it): mix on a fresh lakehouse has nothing ready, so rank 0's
    outcome skips the task with the in-process task's message."""
    from airflow.sdk.exceptions import AirflowSkipException

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"lakehouse_uri": str(tmp_path / "lakehouse"),
                                  "launcher": {"kind": "torchrun", "nproc_per_node": 2}}))
    monkeypatch.setenv("GEM_CONFIG", str(config))
    # As in an Airflow task: the task runner masks the metadata DB's URL (the launched processes import airflow).
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "airflow-db-not-allowed:///")
    monkeypatch.setattr(orchestration, "DISTRIBUTED_STAGES", ("mix",))
    with pytest.raises(AirflowSkipException, match="mix: nothing ready on run day 2026-01-01"):
        orchestration.run_stage_torchrun("mix", "2026-01-01")


def test_the_launched_process_writes_its_outcome_from_rank_0_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gem.deploy import launch

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"lakehouse_uri": str(tmp_path / "lakehouse")}))
    monkeypatch.setenv("GEM_CONFIG", str(config))
    outcome = tmp_path / "outcome.json"
    argv = ["--stage", "mix", "--run-day", "2026-01-01", "--outcome", str(outcome)]
    monkeypatch.setenv("RANK", "1")
    assert launch.main(argv) == 0 and not outcome.exists()
    monkeypatch.setenv("RANK", "0")
    assert launch.main(argv) == 0
    assert launch.read_outcome(outcome) == launch.Outcome("skipped", "mix: nothing ready on run day 2026-01-01")
    # Not rerun (the run starts at a later stage): a success without running, as in-process.
    assert launch.main(["--stage", "mix", "--run-day", "2026-01-01", "--from-stage", "pretrain"]) == 0
    with pytest.raises(RuntimeError, match="wrote no outcome"):
        launch.read_outcome(tmp_path / "missing.json")
