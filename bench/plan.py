"""Benchmark the elastic planner against first-fit decreasing on seeded random models.

    python bench/plan.py [--seeds 5] [--time-limit 10] [--cap USD_PER_HOUR]

Per size (VMs / groups / machine types / existing hosts) it prints, over
``--seeds`` models: median and worst solve time of ``plan``, how many plans
were proven ``exact``, the worst gap (projected − lower bound) / projected,
the mean and best cost ratio exact / FFD (below 1: cheaper than FFD), and
whether any plan placed fewer VMs than FFD or cost more. The last size puts
the same kind of random groups on the shipped AWS catalogue (its type count
is marked ``c``). ``--cap`` puts a $/hour cap on every model (``max_usd_per_hour``), which
leaves work unplaced; the VMs placed, and first fit's, are then printed too (more placed
may cost more than first fit: the first objective is VMs placed). All figures come
from the same run on one core: the process is pinned to one CPU before anything runs (HiGHS
starts a worker thread per CPU it sees; unpinned on a 2-core machine it does ~20% of the
work beside the main thread, which would not be one core). The one-time import of the solver libraries
(scipy/HiGHS, OR-Tools: about 0.5–0.9 s per process) happens before timing
(``planner.warm``), as in a running controller, which warms them at start.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fuse.controller.pool.catalogue import default_catalogue  # noqa: E402
from fuse.controller.pool.greedy import greedy  # noqa: E402
from fuse.controller.pool.model import Constraints, DemandGroup, Offer, PlanModel, PoolHost  # noqa: E402
from fuse.controller.pool.planner import plan, warm  # noqa: E402
from fuse.controller.pool.solution import cost_usd  # noqa: E402

SIZES = [  # (VMs, groups, machine types, existing hosts)
    (12, 1, 10, 0),
    (100, 5, 20, 4),
    (1000, 20, 40, 10),
    (1000, 20, 40, 0),
    (5000, 40, 40, 20),
    (1000, 20, None, 0),  # None: the shipped catalogue's offers instead of random ones
]


def random_offers(rng: random.Random, n: int) -> list[Offer]:
    """``n`` machine types in families like EC2's: size × memory ratio, priced near-linearly."""
    offers = []
    for i in range(n):
        vcpus = rng.choice([2, 4, 8, 16, 32, 48, 64, 96])
        ratio = rng.choice([2048, 4096, 8192])  # MiB per vCPU
        metal = rng.random() < 0.15
        per_vcpu = {2048: 0.042, 4096: 0.050, 8192: 0.066}[ratio] * rng.uniform(0.85, 1.15)
        offers.append(Offer(
            provider="aws", type_name=f"t{i:02d}.{vcpus}x{ratio // 1024}{'.metal' if metal else ''}",
            region="us-west-2", arch=rng.choice(["amd64", "amd64", "arm64"]),
            vcpus=vcpus, mem_mib=vcpus * ratio - 1024, kvm=metal, metal=metal,
            usd_per_hour=round(per_vcpu * vcpus, 4), billing_step_secs=rng.choice([1, 1, 60]),
            billing_min_secs=60, boot_secs=300 if metal else 90, quota_family="aws:standard"))
    return offers


def random_groups(rng: random.Random, vms: int, n_groups: int) -> list[DemandGroup]:
    """``vms`` VMs cut at random into ``n_groups`` groups of random shape, kind and duration."""
    cuts = sorted(rng.sample(range(1, vms), n_groups - 1)) if n_groups > 1 else []
    counts = [b - a for a, b in zip([0] + cuts, cuts + [vms])]
    groups = []
    for g, count in enumerate(counts):
        cpus = rng.choice([1, 1, 2, 2, 4, 8])
        groups.append(DemandGroup(
            name=f"g{g:02d}", count=count, cpus=cpus, mem_mib=cpus * rng.choice([512, 1024, 2048, 4096]),
            kind=rng.choice(["container", "container", "microvm"]),
            duration_secs=rng.choice([600, 3600, 3600, 14400]),
            together=count <= 8 and rng.random() < 0.3))
    return groups


def random_model(seed: int, vms: int, n_groups: int, n_types: int, n_hosts: int) -> PlanModel:
    rng = random.Random(seed)
    groups = random_groups(rng, vms, n_groups)
    hosts = [PoolHost(name=f"dev{h:02d}", vcpus=rng.choice([8, 16, 32]), mem_mib=rng.choice([16384, 32768, 65536]),
                      kvm=True, own=rng.random() < 0.6, usd_per_hour=0.0, paid_secs_left=rng.choice([0, 1800]))
             for h in range(n_hosts)]
    hosts = [h if h.own else h.model_copy(update={"usd_per_hour": 0.8}) for h in hosts]
    return PlanModel(groups=groups, hosts=hosts, offers=random_offers(rng, n_types),
                     constraints=Constraints(), seed=seed)


def catalogue_model(seed: int, vms: int, n_groups: int) -> PlanModel:
    """The same random groups on the shipped AWS catalogue: real prices (linear within a
    family), microVMs on the one KVM-capable type (c6g.metal), Modal one-VM sandboxes."""
    groups = random_groups(random.Random(seed), vms, n_groups)
    return PlanModel(groups=groups, offers=list(default_catalogue()), constraints=Constraints(), seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--cap", type=float, default=None, help="max_usd_per_hour on every model")
    args = ap.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, threads and all
    warm()  # the solver imports and gc.freeze, as a running controller has done at start
    print(f"{'VMs':>5} {'grp':>4} {'types':>5} {'hosts':>5} | {'t med s':>7} {'t max s':>7} "
          f"{'exact':>5} | {'gap max':>8} | {'cost/FFD mean':>13} {'best':>6} | {'worse':>5}"
          + (f" | {'placed':>7} {'FFD':>7}" if args.cap is not None else ""))
    for vms, ng, nt, nh in SIZES:
        times, gaps, ratios, exact, worse, placed_all, ffd_all = [], [], [], 0, 0, 0, 0
        for seed in range(args.seeds):
            model = random_model(seed, vms, ng, nt, nh) if nt is not None else catalogue_model(seed, vms, ng)
            model = model.model_copy(update={"time_limit_secs": args.time_limit})
            if args.cap is not None:
                model = model.model_copy(update={"constraints": model.constraints.model_copy(
                    update={"max_usd_per_hour": args.cap})})
            t0 = time.perf_counter()
            p = plan(model)
            times.append(time.perf_counter() - t0)
            sm = model.sorted()
            ffd = greedy(sm)
            ffd_usd = cost_usd(sm, ffd)
            ffd_placed = sum(ffd.placed(len(sm.groups)))
            placed = sum(a.count for a in p.assignments)
            exact += p.solver == "exact"
            gaps.append((p.projected_usd - p.lower_bound_usd) / p.projected_usd if p.projected_usd else 0.0)
            ratios.append(p.projected_usd / ffd_usd if ffd_usd else 1.0)
            worse += placed < ffd_placed or (placed == ffd_placed and p.projected_usd > ffd_usd + 1e-6)
            placed_all, ffd_all = placed_all + placed, ffd_all + ffd_placed
        print(f"{vms:>5} {ng:>4} {nt or len(default_catalogue()):>4}{'' if nt else 'c'} {nh:>5} | {statistics.median(times):>7.3f} {max(times):>7.3f} "
              f"{exact:>2}/{args.seeds:<2} | {max(gaps):>8.2%} | {statistics.mean(ratios):>13.4f} "
              f"{min(ratios):>6.3f} | {worse:>5}" + (f" | {placed_all:>7} {ffd_all:>7}" if args.cap is not None else ""))


if __name__ == "__main__":
    main()
