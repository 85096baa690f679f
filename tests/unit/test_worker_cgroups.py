"""cgroup v2 for training processes, on a fake hierarchy (a folder of plain files): when the
daemon may use it, what it writes, how it reads the kernel's OOM kill. No real cgroup is
touched (this test machine's may be v1, or not delegated)."""

from __future__ import annotations

from pathlib import Path

from gearshift.worker.cgroups import Cgroups, own_cgroup, problem
from gearshift.worker.tasks import describe_enforcement


def hierarchy(tmp_path: Path, own: str = "svc", offered: str = "cpuset cpu io memory pids") -> Path:
    root = tmp_path / "cgroup"
    (root / own).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / own / "cgroup.controllers").write_text(offered + "\n")
    return root


def test_the_v2_line_of_proc_self_cgroup_is_the_daemons_own() -> None:
    assert own_cgroup("0::/system.slice/gearshift.service\n") == "/system.slice/gearshift.service"
    assert own_cgroup("4:memory:/x\n1:cpu:/\n") is None  # v1 only


def test_cgroups_are_used_only_under_a_delegated_cgroup_offering_both_controllers(
    tmp_path: Path,
) -> None:
    root = hierarchy(tmp_path)
    assert problem(root, "/svc") == ""
    assert problem(root, None) == "no cgroup v2 hierarchy"
    assert problem(tmp_path / "none", "/svc") == "no cgroup v2 hierarchy"
    assert "root cgroup" in problem(root, "/")
    assert "cannot read" in problem(root, "/other")
    thin = hierarchy(tmp_path / "thin", offered="cpu pids")
    assert problem(thin, "/svc").endswith("does not offer cpuset, memory")


def test_the_daemon_moves_into_its_leaf_and_each_process_gets_its_limits(tmp_path: Path) -> None:
    root = hierarchy(tmp_path)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/svc\n")
    cgroups, why = Cgroups.probe(root, proc)
    assert cgroups is not None, why
    assert (root / "svc" / "daemon" / "cgroup.procs").read_text().strip().isdigit()
    assert (root / "svc" / "cgroup.subtree_control").read_text() == "+cpuset +memory\n"
    path = cgroups.create("t1.rank0", [2, 3], 512 << 20)
    cgroups.add(path, 4242)
    assert (path / "cpuset.cpus").read_text() == "2-3\n"
    assert (path / "memory.max").read_text() == f"{512 << 20}\n"
    assert (path / "cgroup.procs").read_text() == "4242\n"
    assert not Cgroups.oom_killed(path)
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert Cgroups.oom_killed(path)


def test_a_machine_without_cgroup_v2_says_why(tmp_path: Path) -> None:
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:memory:/x\n")
    assert Cgroups.probe(tmp_path, proc) == (None, "no cgroup v2 hierarchy")
    assert Cgroups.probe(tmp_path, tmp_path / "missing")[1].startswith("cannot read")


def test_the_enforcement_names_the_cgroup_when_one_is_used() -> None:
    assert describe_enforcement({0: [1]}, 1 << 30, cgroup=True) == (
        "cgroup v2 (cpuset.cpus, memory.max); affinity cores 1 (rank 0); "
        "RSS watchdog 1.0 GiB per process"
    )
