"""Run tasks on a Ray cluster (``schedlab run --backend ray [--address ADDR]``).

Ray is optional (``pip install 'schedlab[ray]'``). Each task is one Ray task taking one CPU;
its result comes back through Ray's object store. Without ``--address`` a local Ray instance
is started with this machine's CPUs and stopped afterwards; with one (``auto``, or
``ray://head:10001``) the existing cluster is used and left running. Every node needs
schedlab (and the experiment's plugin modules) installed, and the experiment's data files at
the same path.
"""

from __future__ import annotations

from concurrent.futures import Future

from ..errors import ConfigError
from .executor import own_spooled_rows, run_task
from .tasks import RunTask


#: Seconds to wait for a cluster's address to answer before Ray is asked to join it.
CONNECT_TIMEOUT_S = 10.0


def _check_reachable(address: str | None) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) address where nothing answers: ``ray.init``
    retries such an address for minutes, printing its own warnings, before it gives up."""
    import socket

    if not address or address == "auto" or address == "local":
        return
    where = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        return  # (an address of another form: Ray says what it makes of it)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise ConfigError(f"--address {address}: cannot connect to a Ray cluster: nothing answers there ({reason}); "
                          "start one with `ray start --head`, or leave --address out for a local one") from None


class RayExecutor:
    """Submits tasks as Ray tasks; ``workers`` is the cluster's CPUs (or ``jobs``, if fewer)."""

    def __init__(self, address: str | None = None, jobs: int | None = None):
        try:
            import ray
        except ImportError:
            raise ConfigError("--backend ray needs Ray: pip install 'schedlab[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            _check_reachable(address)
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            except ConnectionError as exc:
                raise ConfigError(f"--address {address}: cannot connect to a Ray cluster: {exc}") from None
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        self.workers = min(jobs, cpus) if jobs else cpus
        where = address or "a local Ray instance"
        self.description = f"Ray ({where}, {self.workers} workers)"
        self._remote = ray.remote(num_cpus=1, max_retries=0)(run_task)

    def submit(self, task: RunTask) -> Future:
        future = self._remote.remote(task).future()
        future.add_done_callback(own_spooled_rows)  # (a large run's rows, if this machine's spool has them)
        return future

    def close(self, now: bool = False) -> None:
        if self._started:  # (a Ray instance it started ends with its tasks, now or not)
            self._ray.shutdown()
            self._started = False
