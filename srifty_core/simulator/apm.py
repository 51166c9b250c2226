"""APM: the analytical baseline the method compares against, with the same interface.

- compute: one line t = a*B + b per pass through the profile's measured points (Nexus-style),
  held at or above the fastest measured pass, no variance; the slowest type sets the pace;
- communication: ring allreduce with an alpha-beta model from the *rated* network bandwidth
  (Daydream / nccl-tests style): t(s) = 2(n-1) alpha + 2 (n-1)/n * s / beta;
- no overlap (Cynthia-style): t_iter = t_fw + t_bw + sum of the buckets' allreduce times.

Loopback has no rated bandwidth; for local workers ``default_gbps`` stands in for a typical
VM NIC rating (10 Gbps), since APM has nothing else to go on.
"""

from __future__ import annotations

from srifty_core.predictors.compute import fit_line
from srifty_core.simulator.exchange import bus_bytes
from srifty_core.simulator.types import ClusterConfig, IterationEstimate, Workload


class ApmEstimator:
    def __init__(self, *, alpha_s: float = 20e-6, default_gbps: float = 10.0) -> None:
        self.alpha_s = alpha_s
        self.default_gbps = default_gbps

    def _beta(self, config: ClusterConfig) -> float:
        gbps = []
        for g in config.groups:
            rated = g.instance.features.get("network_gbps")
            gbps.append(float(rated) if rated else self.default_gbps)
        return min(gbps) * 1e9 / 8  # bytes/s

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        t_fw = t_bw = 0.0
        slow = None
        for g in config.groups:
            p = workload.profile(g.instance.device_type)
            # the line, but never under the fastest pass measured: a line through a curve
            # that bends up can cross zero below the profiled batches, and a 0 s
            # iteration is no estimate (the planner refuses it)
            b = g.batch_per_rank
            fw = max(fit_line(p.fw.batch_sizes, p.fw.mean_s).at(b), min(p.fw.mean_s))
            bw = max(fit_line(p.bw.batch_sizes, p.bw.mean_s).at(b), min(p.bw.mean_s))
            if fw + bw > t_fw + t_bw:
                t_fw, t_bw, slow = fw, bw, p
        n = config.world_size
        t_pe = 0.0
        if n > 1 and slow is not None:
            beta = self._beta(config)
            t_pe = sum(
                2 * (n - 1) * self.alpha_s + bus_bytes(b.size_bytes, n) / beta for b in slow.buckets
            )
        t_iter = t_fw + t_bw + t_pe
        return IterationEstimate(
            t_iter=t_iter,
            t_fw=t_fw,
            t_bw=t_bw,
            t_pe=t_pe,
            exposed_comm=t_pe,
            p50=t_iter,
            p95=t_iter,
            global_batch=config.global_batch,
            world_size=n,
            bottleneck="communication" if t_pe > t_bw else "compute",
        )
