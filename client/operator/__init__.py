"""The GearshiftJob operator (kopf): Kubernetes objects in, scheduler gRPC calls out.

Needs the `operator` extra (kopf). docs/operator/kubernetes-operator.md says how to run it.
"""
