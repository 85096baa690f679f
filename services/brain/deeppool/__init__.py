"""DeepPool's burst-parallel planner as plain functions over plain data.

profiles (LayerGraph), prof (the paper's .prof files), costs (the network model),
structure (branch-join blocks), planner (Algorithm 1); planning needs only NumPy. The
measuring - the torch.fx profiler and the reference models - is the worker's
(gearshift.worker.profiling): it sends a LayerProfile message, which the Brain turns
into a LayerGraph (gearshift.brain.profile_messages).
"""

from .costs import FREE_NETWORK, Network, build_costs
from .planner import Evaluation, Plan, elastic_device_count, evaluate, plan
from .prof import load_prof, read_prof
from .profiles import LayerGraph, graph_from_batch_times

__all__ = [
    "FREE_NETWORK",
    "Evaluation",
    "LayerGraph",
    "Network",
    "Plan",
    "build_costs",
    "elastic_device_count",
    "evaluate",
    "graph_from_batch_times",
    "load_prof",
    "plan",
    "read_prof",
]
