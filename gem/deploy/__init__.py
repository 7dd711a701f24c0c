"""Deployment: the files under deploy/ (an image, a compose file, Helm values, Kubernetes manifests),
rendered from the config and the stage registry (`python -m gem.deploy render`), and the launched
stage's process the DAG's torchrun and cluster-job tasks start (gem.deploy.launch)."""
