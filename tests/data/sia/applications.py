"""A miniature of the Sia artifact's applications.py (written for the tests): one model."""

import os

TRACES_DIR = "traces"


class Application:
    def __init__(self, trace_dir: str, cluster_suffix: str, max_epochs: int) -> None:
        self.name = os.path.basename(trace_dir)
        if self.name == "toy":
            self.rescale_time = 40
        else:
            self.rescale_time = 30


APPLICATIONS = {
    "fast": {
        "toy": Application(os.path.join(TRACES_DIR, "toy"), cluster_suffix="fast", max_epochs=2)
    },
    "slow": {
        "toy": Application(os.path.join(TRACES_DIR, "toy"), cluster_suffix="slow", max_epochs=2)
    },
}
