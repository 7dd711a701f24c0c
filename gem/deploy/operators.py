"""The Airflow operators of the stages' cluster jobs (`launcher.kind: cluster_job`), from the
cncf-kubernetes provider, each submitting the manifest gem.deploy.manifests builds:

- a Spark stage's SparkApplication through the provider's SparkKubernetesOperator, which creates it,
  follows its driver pod and log, and fails when the driver fails;
- a torch stage's PyTorchJob through PyTorchJobOperator: the provider's
  KubernetesCreateResourceOperator, which only creates a resource, extended to replace the day's job
  from an earlier try first and to wait for the job's Succeeded or Failed condition.

Imported only when a DAG with `launcher.kind: cluster_job` is parsed (gem.pipeline.airflow.daily_dag).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import yaml
from airflow.providers.cncf.kubernetes.operators.resource import KubernetesCreateResourceOperator
from airflow.providers.cncf.kubernetes.operators.spark_kubernetes import SparkKubernetesOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException
from kubernetes.client.exceptions import ApiException

from gem.deploy.manifests import cluster_job
from gem.lakehouse.stages import Stage

if TYPE_CHECKING:
    from gem.config import LauncherConfig, SparkConfig

SUCCEEDED, FAILED = "Succeeded", "Failed"
# How long the deletion of the day's earlier job may take before the new one is created.
DELETE_TIMEOUT_S = 300.0
NOT_FOUND = 404


def job_state(job: dict[str, Any]) -> tuple[str | None, str]:
    """(SUCCEEDED or FAILED once a training-operator job's conditions say so, None while it runs;
    the deciding condition's message)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in (SUCCEEDED, FAILED) and condition.get("status") == "True":
            return condition["type"], condition.get("message", "")
    return None, ""


def wait_for_job(read: Callable[[], dict[str, Any]], name: str, poll_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> str:
    """Read the job every poll_s seconds until it has succeeded (-> its condition's message) or
    failed (AirflowException naming it and the condition's message)."""
    while True:
        state, message = job_state(read())
        if state == SUCCEEDED:
            return message
        if state == FAILED:
            raise AirflowException(f"PyTorchJob {name} failed: {message or 'no message'}")
        sleep(poll_s)


class PyTorchJobOperator(KubernetesCreateResourceOperator):
    """Create a PyTorchJob from `manifest` (a templated field: its Jinja renders per task instance)
    and wait until it has succeeded or failed, asking every poll_s seconds. The job is named for its
    day: one left by an earlier try or run of the day is deleted first, as the day's partitions are
    replaced. Killing the task deletes the job."""

    template_fields = (*KubernetesCreateResourceOperator.template_fields, "manifest")
    template_fields_renderers: ClassVar[dict[str, str]] = {**KubernetesCreateResourceOperator.template_fields_renderers, "manifest": "json"}

    def __init__(self, *, manifest: dict[str, Any], poll_s: float, **kwargs: Any) -> None:
        super().__init__(custom_resource_definition=True, **kwargs)
        self.manifest = manifest
        self.poll_s = poll_s

    def _coordinates(self) -> tuple[str, str, str, str, str]:
        group, version, namespace, plural = self.get_crd_fields(self.manifest)
        return group, version, namespace, plural, self.manifest["metadata"]["name"]

    def _read(self) -> dict[str, Any]:
        return self.custom_object_client.get_namespaced_custom_object(*self._coordinates())

    def _delete(self) -> bool:
        """Delete the job; False when there is none."""
        try:
            self.custom_object_client.delete_namespaced_custom_object(*self._coordinates(),
                                                                      propagation_policy="Foreground")
        except ApiException as error:
            if error.status == NOT_FOUND:
                return False
            raise
        return True

    def _replace_earlier(self) -> None:
        if not self._delete():
            return
        name = self.manifest["metadata"]["name"]
        self.log.info("deleted the earlier PyTorchJob %s; waiting for it to go", name)
        deadline = time.monotonic() + DELETE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                self._read()
            except ApiException as error:
                if error.status == NOT_FOUND:
                    return
                raise
            time.sleep(min(self.poll_s, 5.0))
        raise AirflowException(f"the earlier PyTorchJob {name} was still there {DELETE_TIMEOUT_S:.0f} s after its deletion")

    def execute(self, context: Any) -> None:
        self.yaml_conf = yaml.safe_dump(self.manifest, sort_keys=False)
        self._replace_earlier()
        super().execute(context)
        name = self.manifest["metadata"]["name"]
        self.log.info("PyTorchJob %s created; waiting for it to finish", name)
        self.log.info("PyTorchJob %s succeeded: %s", name, wait_for_job(self._read, name, self.poll_s))

    def on_kill(self) -> None:
        self._delete()


def cluster_job_operator(stage: Stage, launcher: LauncherConfig, spark: SparkConfig, run_day: str,
                         from_stage: str, **task_args: Any) -> BaseOperator:
    """The task submitting a stage's cluster job (gem.deploy.manifests.cluster_job) in the launcher's
    namespace through its Kubernetes connection; task_args (task_id, outlets, pool, ...) as for any task."""
    manifest = cluster_job(stage, launcher, spark, run_day, from_stage)
    common = {"namespace": launcher.namespace, "kubernetes_conn_id": launcher.kubernetes_conn_id, **task_args}
    if stage.spark:
        return SparkKubernetesOperator(template_spec={"spark": manifest}, name=manifest["metadata"]["name"],
                                       get_logs=True, delete_on_termination=True, **common)
    return PyTorchJobOperator(manifest=manifest, poll_s=launcher.poll_s, **common)
