"""Collective communication time between GPUs: all-reduce, all-gather, reduce-scatter,
all-to-all and send/recv, as NCCL runs them over a machine's links.

Every cost model that splits work over GPUs times its communication here: tensor parallelism's
all-reduces (:mod:`.tensor_parallel`), the all-gather and reduce-scatter that dispatch and
combine a data-parallel deployment's experts (:mod:`.expert_parallel`) and the send/recv
between pipeline stages (:mod:`.pipeline`). A third-party cost model imports it the same way
(``from schedlab_plugins.cost_models.collectives import Collectives, topology``).

**The model** follows NCCL's own cost model (``src/graph/tuning.cc``, ``ncclTopoTuneModel``):
for each algorithm (ring; tree for an all-reduce across nodes) and protocol (LL, LL128 on
NVLink, Simple) a collective of ``S`` bytes over ``n`` ranks takes::

    base latency + steps x per-hop latency + S x factor / (bus bandwidth x protocol efficiency)

and NCCL picks the fastest *by its own model*. A ring all-reduce takes ``2 (n - 1)`` steps and moves ``2 (n - 1) / n``
of the buffer over each GPU's link (Patarasuk and Yuan, 2009); all-gather and reduce-scatter
half of that; all-to-all sends ``(n - 1) / n`` of each rank's buffer to its peers at once;
send/recv one hop. LL carries 8 bytes of data in 16 (half the bandwidth, the lowest latency),
LL128 120 in 128, Simple all of it. The latencies are NCCL's constants (:data:`BASE_US`,
:data:`HOP_US`), the bus bandwidths the topology's (:class:`Topology`).

**NCCL's pick is not always the fastest protocol.** NCCL chooses the protocol of an
all-reduce, all-gather or reduce-scatter from its *own* bandwidth estimate (``ncclTopoTuneModel``:
the ring graph's channels x per-channel bandwidth from its topology search, LL capped at
``llMaxBws``, LL128 at 0.92 of it) and ``topoGetAlgoInfo`` (``src/enqueue.cc``) takes the
fastest by that model -- then the kernel runs at the machine's real rate for that protocol.
Where a topology gives NCCL's estimate (``nccl_bus_gbps``), the protocol is NCCL's pick and
its time the measured rates' (LL128 at the measured ``ll128_share`` of the bus, Simple with its
measured latency beyond NCCL's constants, ``simple_extra_us`` + ``simple_extra_hop_us`` a ring
step). On a DGX A100 this is the mid-size shortfall: NCCL rates the node at 240 GB/s and LL128
at 0.92 of it, so 8 GPUs stay on LL128 up to 24.3 MB, where Vidur's timings drop (367 us at
23.9 MB, 347 at 25.4; :data:`A100_NCCL`), but LL128 delivers 0.62 of Simple's bandwidth there,
and Simple, on 2 and 4 GPUs from 1-6 MB, pays 23.2 us + 3.07 us a step more than NCCL's
constants (:data:`NCCL_PROTOCOLS_FIT`).
The channel count is not it: ``topoGetAlgoInfo`` drops channels only while the buffer is below
channels x threads x ``threadThreshold`` (Simple: 512 x 64 B = 32 KB a channel, every channel
busy from 1 MB), and the send/recv of all-to-all and pipelines take NCCL's p2p path, not this
model (their protocol stays the fastest one).

**NVLS: an NVSwitch node's all-reduce is not a ring.** On Hopper and later NVSwitch nodes NCCL also
has NVLS (NVLink SHARP: the switch reduces and multicasts; ``src/transport/nvls.cc``,
``ncclNvlsInit``: any 2 or more GPUs with multicast support), and its tuner (NCCL 2.28.3 on)
rates an NVLS all-reduce at ``nChannels x bwIntra x nvlsEfficiency x (nChannels - 1) /
nChannels x 2`` --
the NVLS graph's channels and per-channel speed from its search (``src/graph/search.cc``,
``ncclTopoSearchTryNvls``: one channel per GPU, each GPU's link carrying ``ranks + 1`` times the
speed) -- against the ring's channels x speed (:func:`nccl_nvls_all_reduce_gbps`,
:func:`nccl_ring_gbps`). On a DGX H100 that is 102, 306, 408 and 476 GB/s at 2, 4, 5 and 8 GPUs
against the ring's 360: from 5 GPUs NCCL's all-reduce runs as NVLS (at 25 us, below the ring's
Simple latency), and the all-reduce bus bandwidth measured there (403 GB/s at 8 GPUs; 445 on the
held-out node at 512 MB, past the 18 x 20.6 GB/s a ring can use) is NVLS's. All-gather and
reduce-scatter can run as NVLS too (NCCL 2.17 and 2.19 on), but the tuner rates them at
``... x (ranks - 1) / ranks`` without the all-reduce's factor 2 (at 8 GPUs 208 GB/s of algorithm
bandwidth against the ring's 360 x 8 / 7 = 411; its LL and LL128 rings win at every size), so
NCCL 2.29 runs them as rings -- unless registered buffers and ``NCCL_CTA_POLICY_EFFICIENCY`` force
NVLS (``ncclGetAlgoInfo``); an all-to-all is grouped send/recv (``src/enqueue.cc``,
``scheduleP2pTasksToPlan``), never NVLS. They take the ring's bus bandwidth
(:meth:`Topology.ring_bus_gbps`: the measured all-reduce's below ``nvls_ranks``; on the DGX H100
Vidur's 4-GPU 361 GB/s, which is NCCL's own ring estimate for 4 and 8 GPUs alike, 12 channels x
30 GB/s).

**Links** (NCCL's three latency classes): ``nvlink`` (NVLink or NVSwitch), ``pcie`` (PCIe with
peer-to-peer: one GPU writes straight into the other's memory) and ``host`` (PCIe *without*
peer-to-peer -- GeForce cards, many cloud VMs, IOMMU/ACS on: NCCL's SHM transport, where the
sender's SMs write into pinned host memory and the receiver's SMs read it back over PCIe).
Between nodes a ``network`` (InfiniBand / RoCE), one NIC per GPU as in a DGX.

**Topology presets** (:data:`TOPOLOGIES`) are real machines with the bus bandwidths NCCL
reaches there, measured: Vidur's NCCL timings on DGX H100/A100 and NVLink-pair boxes (fitted
by ``tools/derive_collectives.py``, quoted in :data:`DERIVATION`; the pairs' rings across PCIe
give the PCIe peer-to-peer rates) and, for PCIe through host memory, a named measurement on
RTX PRO 6000 servers (:data:`PCIE_HOST_GBPS`). Each preset's ``source`` says which.

vLLM's own all-reduce kernels, which replace NCCL where GPUs reach each other directly (custom
all-reduce over NVLink, symmetric memory on Hopper and Blackwell), are not NCCL's: a tensor-
parallel layer's all-reduces take their measured times on the machines they were measured on
(:mod:`.vllm_all_reduce`). Without peer-to-peer, as on the shipped TP 2 run, vLLM uses NCCL.
"""

from __future__ import annotations

import difflib
import math
import statistics
from typing import Any, Mapping

import attrs

from schedlab.configs import FieldError, float_field, int_field, str_field
from schedlab.errors import ConfigError

# --- NCCL's constants (src/graph/tuning.cc, NVIDIA/nccl master, 2026) ------------------------

#: Protocols in NCCL's order, and the share of the bus bandwidth each carries as data.
PROTOCOLS = ("LL", "LL128", "Simple")
PROTOCOL_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
#: the tree's own: ``if (a == NCCL_ALGO_TREE && p == NCCL_PROTO_LL) busBw = min(busBw * 1.0 / 3.8, llMaxBw)``
TREE_PROTOCOL_EFFICIENCY = {"LL": 1.0 / 3.8, "Simple": 1.0}
#: ``baseLatencies``: fixed cost of one collective (kernel start, first chunk), us.
BASE_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},
           "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}}
#: ``hwLatencies``: time of one step over each kind of link, us.
HOP_US = {
    "nvlink": {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}, "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}},
    "pcie": {"ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}, "tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}},
    "network": {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}, "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}},
}
#: NCCL's LL128 share of the bus in its own model (``busBw * 0.92 /*120.0/128.0*/``), and
#: its LL ceiling by GPU generation on one node (``llMaxBws``: Volta, Ampere, Hopper, Blackwell).
NCCL_LL128_SHARE = PROTOCOL_EFFICIENCY["LL128"]
NCCL_LL_MAX_GBPS = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
#: NCCL's tree all-reduce reaches 0.92 of the bus bandwidth (``busBw * .92``).
TREE_EFFICIENCY = 0.92
#: The latency class of each link kind (``host`` is PCIe to NCCL's tuner).
LINK_CLASS = {"nvlink": "nvlink", "pcie": "pcie", "host": "pcie"}
LINKS = tuple(LINK_CLASS)
#: NCCL's bandwidth of one NVLink, GB/s (``src/graph/topo.h``: ``SM80_NVLINK_BW``, ``SM90_NVLINK_BW``).
NCCL_NVLINK_GBPS = {"ampere": 20.0, "hopper": 20.6}
#: The per-channel speeds, GB/s, NCCL's topology search tries inside a Hopper node, fastest first
#: (``src/graph/search.cc``, ``sm90SpeedArrayIntra``).
NCCL_SM90_SPEEDS = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
#: ``nvlsEfficiency`` (``src/graph/tuning.cc``): the share of NVLS's links NCCL's tuner counts on Hopper.
NCCL_NVLS_EFFICIENCY = {"hopper": 0.85}


def nccl_ring_gbps(gpu_gbps: float, speeds=NCCL_SM90_SPEEDS) -> float:
    """The ring bus bandwidth NCCL's tuner assumes inside an NVSwitch node whose GPUs each have
    ``gpu_gbps`` of NVLink into the switches (``ncclTopoTuneModel``: ``graphs[RING]->nChannels x
    bwIntra``): each ring channel takes its speed out of and into every GPU, so at a speed the
    search (``ncclTopoCompute``) fits ``gpu_gbps // speed`` channels. It starts at the fastest
    speed, tries slower ones while they are more than 0.49 of the speed found, and keeps a slower
    one only if it carries more (``ncclTopoCompareGraphs``); ``ncclTopoDupChannels`` then doubles
    the channels at half the speed, the same total. DGX H100, 18 x 20.6 GB/s: 6 channels at 60 =
    360 GB/s (50: 350, 40 and 30: 360; 12 at 30 after duplication)."""
    found = 0.0, 0.0  # (total, speed)
    for s in speeds:
        if found[1] and s / found[1] <= 0.49:
            break
        total = int(gpu_gbps // s) * s
        if total > found[0]:
            found = total, s
    return found[0]


def nccl_nvls_all_reduce_gbps(ranks: int, gpu_gbps: float, efficiency: float, speeds=NCCL_SM90_SPEEDS) -> float:
    """The bus bandwidth NCCL's tuner gives an NVLS all-reduce of ``ranks`` GPUs of one NVSwitch
    node (``ncclTopoTuneModel``: ``nChannels x bwIntra x nvlsEfficiency x (nChannels - 1) /
    nChannels``, x 2 for an all-reduce, which pipelines its reduce and its multicast). The NVLS
    graph has one channel per GPU (``ncclTopoCompute``: ``minChannels = maxChannels = ngpus`` on
    one node), and in channel ``g`` the switch reads from and writes to every GPU once and GPU
    ``g`` twice (``ncclTopoSearchTryNvls``), so every GPU's link carries ``ranks + 1`` times the
    speed: the fastest speed of ``speeds`` that fits. NVLS needs 2 channels."""
    if ranks < 2:
        return 0.0
    speed = next((s for s in speeds if (ranks + 1) * s <= gpu_gbps), 0.0)
    return ranks * speed * efficiency * (ranks - 1) / ranks * 2.0


def nccl_nvls_ranks(gpu_gbps: float, efficiency: float, speeds=NCCL_SM90_SPEEDS, most: int = 8) -> int | None:
    """The fewest GPUs of one NVSwitch node whose all-reduce NCCL's tuner rates faster as NVLS
    than as a ring (None: none up to ``most``); from there on it runs NVLS from 1-2 MB up (NVLS's
    latency in NCCL's tuner, ``hwLatencies`` NVLink NVLS Simple, 25 us, is below the ring's Simple
    latency from 4 GPUs on, 8.4 + 2 (n - 1) x 3.4 us; the ring's LL keeps the small sizes)."""
    ring = nccl_ring_gbps(gpu_gbps, speeds)
    return next((n for n in range(2, most + 1) if nccl_nvls_all_reduce_gbps(n, gpu_gbps, efficiency, speeds) > ring),
                None)


def _bandwidth_table(value) -> tuple[tuple[int, float], ...]:
    """``{ranks: GB/s}`` or ``[[ranks, GB/s], ...]`` as a sorted tuple of pairs."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = tuple(sorted((int(r), float(g)) for r, g in items))
    except (TypeError, ValueError):
        raise FieldError("bus_gbps_by_ranks", f"must map rank counts to GB/s, got {value!r}") from None
    for ranks, gbps in pairs:
        if ranks < 2 or not gbps > 0 or not math.isfinite(gbps):
            raise FieldError("bus_gbps_by_ranks", f"needs ranks >= 2 and GB/s > 0, got {ranks}: {gbps}")
    return pairs


@attrs.frozen
class Topology:
    """A machine's GPU-to-GPU links, as NCCL sees them.

    Ranks fill nodes of ``gpus_per_node`` GPUs. Inside a node, groups of ``island`` GPUs share a
    fast link (``link`` at ``bus_gbps``: an NVSwitch node is one island, an NVLink-bridged box
    has islands of 2); a ring that leaves its island runs at ``cross_island_gbps`` over
    ``cross_island_link``. A ring that leaves its node runs at ``network_gbps``.
    """

    name: str = str_field(help="preset name or a label for a custom machine")
    link: str = str_field(choices=LINKS, help="link inside an island: nvlink, pcie (peer-to-peer) or host "
                                               "(PCIe without peer-to-peer: through host memory)")
    bus_gbps: float = float_field(min=0.0, min_exclusive=True,
                                  help="bus bandwidth an NCCL ring reaches inside an island, GB/s per GPU")
    gpus_per_node: int = int_field(8, min=1, help="GPUs per node")
    island: int | None = int_field(None, min=1, optional=True,
                                   help="GPUs sharing the fast link (unset: the whole node)")
    bus_gbps_by_ranks: tuple = attrs.field(
        default=(), converter=_bandwidth_table,
        metadata={"help": "measured all-reduce bus bandwidth by rank count inside an island (overrides bus_gbps "
                          "there; linear between the measured counts, the nearest outside)"})
    p2p_gbps: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                         help="send/recv bandwidth inside an island, GB/s (unset: bus_gbps)")
    cross_island_link: str = str_field("pcie", choices=LINKS, help="link between islands of a node")
    cross_island_gbps: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                                  help="bus bandwidth of a ring leaving its island, GB/s")
    network_gbps: float | None = float_field(None, min=0.0, min_exclusive=True, optional=True,
                                             help="bandwidth between nodes per GPU (one NIC each), GB/s")
    network_hop_us: float | None = float_field(None, min=0.0, optional=True,
                                               help="one step between nodes, us (unset: NCCL's constants)")
    hop_us: float | None = float_field(None, min=0.0, optional=True,
                                       help="one step inside a node for every protocol, us (unset: NCCL's constants)")
    base_us: float | None = float_field(None, min=0.0, optional=True,
                                        help="fixed cost of one collective for every protocol, us (unset: NCCL's)")
    nccl_bus_gbps: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True,
        help="bus bandwidth NCCL's own tuner assumes inside an island (its ring channels x per-channel bandwidth); "
             "set: an all-reduce, all-gather or reduce-scatter takes the protocol NCCL's model picks, timed at the "
             "measured rates (unset: the fastest protocol at the measured rates)")
    nccl_ll_max_gbps: float | None = float_field(
        None, min=0.0, min_exclusive=True, optional=True,
        help="NCCL's ceiling on LL's bus bandwidth for this GPU on one node (tuning.cc llMaxBws; unset: none)")
    ll128_share: float | None = float_field(None, min=0.0, max=1.0, min_exclusive=True, optional=True,
                                            help="share of the bus bandwidth LL128 delivers where NCCL's model picks "
                                                 "it (with nccl_bus_gbps; unset: NCCL's 0.92)")
    simple_extra_us: float = float_field(0.0, min=0.0, help="fixed cost a Simple-protocol ring pays beyond NCCL's "
                                                            "base latency where NCCL's model picks it, us "
                                                            "(with nccl_bus_gbps)")
    simple_extra_hop_us: float = float_field(0.0, min=0.0, help="what each step of such a Simple ring pays beyond "
                                                                "NCCL's hop latency, us (with nccl_bus_gbps)")
    nvls_ranks: int | None = int_field(
        None, min=2, optional=True,
        help="from this many ranks of one island NCCL's all-reduce runs as NVLS (the NVSwitch reduces): the "
             "measured all-reduce bus bandwidth there is NVLS's, and all-gather, reduce-scatter and all-to-all, "
             "which stay rings and send/recv, take the ring's, measured below it (unset: no NVLS)")
    source: str = str_field("", help="where the numbers come from")

    def __attrs_post_init__(self) -> None:
        if self.island is not None and self.gpus_per_node % self.island:
            raise ConfigError(f"topology {self.name!r}: island ({self.island}) must divide gpus_per_node "
                              f"({self.gpus_per_node})")

    @property
    def island_size(self) -> int:
        return self.island or self.gpus_per_node

    def island_bus_gbps(self, ranks: int) -> float:
        """All-reduce bus bandwidth of ``ranks`` GPUs of one island."""
        table = self.bus_gbps_by_ranks
        if not table:
            return self.bus_gbps
        if ranks <= table[0][0]:
            return table[0][1]
        for (r0, g0), (r1, g1) in zip(table, table[1:]):
            if ranks <= r1:
                return g0 + (g1 - g0) * (ranks - r0) / (r1 - r0)
        return table[-1][1]

    def ring_bus_gbps(self, ranks: int) -> float:
        """Bus bandwidth of a ring (all-gather, reduce-scatter) or of all-to-all's send/recv over
        ``ranks`` GPUs of one island: the all-reduce's (:meth:`island_bus_gbps`) where that is a
        ring; from ``nvls_ranks`` on, where the all-reduce measured is NVLS's, the measured rank
        counts below it (the nearest: NCCL's ring graph inside an NVSwitch node is the same for
        every rank count, :func:`nccl_ring_gbps`)."""
        if self.nvls_ranks is None or ranks < self.nvls_ranks:
            return self.island_bus_gbps(ranks)
        below = [(r, g) for r, g in self.bus_gbps_by_ranks if r < self.nvls_ranks]
        if not below:
            return self.bus_gbps
        return attrs.evolve(self, bus_gbps_by_ranks=below, nvls_ranks=None).island_bus_gbps(ranks)


#: What ``tools/derive_collectives.py`` printed on Vidur's NCCL timings
#: (../shared/calibration/vidur/profiling/network, MIT): the bus bandwidth (GB/s) that, with
#: NCCL's latency constants, fits each measured series of the size > 64 KB points above the
#: measured latency floor (least squares in log time); network hop latency likewise from the
#: 2-node send/recv. Keyed by (Vidur's topology folder, collective, ranks, GPUs per node).
DERIVATION = {
    ("h100_dgx", "all_reduce", 2, 2): 285.0, ("h100_dgx", "all_reduce", 4, 4): 361.0,
    ("h100_dgx", "all_reduce", 8, 8): 403.0, ("h100_dgx", "send_recv", 2, 2): 372.0,
    ("h100_dgx", "send_recv", 2, 1): 36.0,
    ("a100_dgx", "all_reduce", 2, 2): 171.0, ("a100_dgx", "all_reduce", 4, 4): 192.0,
    ("a100_dgx", "all_reduce", 8, 8): 208.0, ("a100_dgx", "send_recv", 2, 2): 274.0,
    ("a100_dgx", "send_recv", 2, 1): 8.0,
    ("h100_pairwise_nvlink", "all_reduce", 2, 2): 196.0, ("h100_pairwise_nvlink", "all_reduce", 4, 4): 48.0,
    ("h100_pairwise_nvlink", "send_recv", 2, 2): 387.0,
    ("a100_pairwise_nvlink", "all_reduce", 2, 2): 185.0, ("a100_pairwise_nvlink", "all_reduce", 4, 4): 23.0,
    ("a100_pairwise_nvlink", "send_recv", 2, 2): 387.0,
    # Between two of these boxes (the a100 and h100 files hold the same numbers): 3 GB/s, a
    # slow Ethernet rather than InfiniBand, with timings scattered by 2x at the same size.
    ("a100_pairwise_nvlink", "send_recv", 2, 1): 3.0, ("h100_pairwise_nvlink", "send_recv", 2, 1): 3.0,
    # A B200 node, from NVIDIA aiconfigurator's NCCL 2.29.2 timings (B200_LATENCY's latency)
    ("b200_dgx", "all_reduce", 2, 2): 440.0, ("b200_dgx", "all_reduce", 4, 4): 491.0,
    ("b200_dgx", "all_reduce", 8, 8): 531.0,
}
#: What NCCL's own tuner believes of a DGX A100, which picks its protocols (``nccl_bus_gbps``,
#: ``nccl_ll_max_gbps``): 12 NVLinks a GPU into the NVSwitches at ``SM80_NVLINK_BW`` = 20 GB/s
#: each (src/graph/topo.h); the ring search (src/graph/search.cc, ``speedArrayIntra``) finds 6
#: channels at 40 GB/s and ``ncclTopoDupChannels`` splits them into 12 at 20, so
#: ``ncclTopoTuneModel`` rates the ring at 12 x 20 = 240 GB/s, LL at ``llMaxBws`` (Ampere, one
#: node) 87.7 and LL128 at 0.92 x 240. By that model 8 GPUs keep LL128 up to 24.3 MB (its
#: latency is 15.4 us below Simple's: 14 + 14 x 1.9 against 8.4 + 14 x 3.4; its bandwidth term
#: 1.75 x S / 240 GB/s x (1 / 0.92 - 1) catches up there) and 4 GPUs up to 6.3 MB; Vidur's 8-GPU
#: timings drop from 367 us at 23.9 MB to 347 us at 25.4 MB.
A100_NCCL = {"nccl_bus_gbps": 12 * 20.0, "nccl_ll_max_gbps": NCCL_LL_MAX_GBPS["ampere"]}
#: What the protocols NCCL's tuner picks really do there, fitted together by
#: ``tools/derive_collectives.py`` (``fit_protocols``) to Vidur's in-node all-reduces on 2, 4 and 8
#: GPUs, each at its own bus bandwidth: LL128 carries 0.62 of Simple's bus bandwidth (NCCL's
#: model: 0.92), and Simple pays 23.2 us + 3.07 us a ring step more than NCCL's latency constants
#: (8.4 + 3.4 a step on NVLink). aiconfigurator's nccl-tests on another A100 node, fitted alone,
#: give LL128 0.66-0.82 and Simple 20, 30 and 50 us over NCCL's on 2, 4 and 8 GPUs (README, "Held out").
NCCL_PROTOCOLS_FIT = {"a100_dgx": {"ll128_share": 0.62, "simple_extra_us": 23.2, "simple_extra_hop_us": 3.07}}
#: Where a DGX H100's all-reduce runs as NVLS by NCCL's tuner: 18 NVLinks a GPU into the
#: NVSwitches at ``SM90_NVLINK_BW`` (18 x 20.6 = 370.8 GB/s): the ring 6 x 60 = 360 GB/s, NVLS 102,
#: 306, 408 and 476 GB/s at 2, 4, 5 and 8 GPUs (:func:`nccl_nvls_all_reduce_gbps`), so from 5 GPUs.
H100_NVLS = {"nvls_ranks": nccl_nvls_ranks(18 * NCCL_NVLINK_GBPS["hopper"], NCCL_NVLS_EFFICIENCY["hopper"])}
#: A B200 node's NCCL latency, which NCCL's constants put too low there: ``base + 2 (n - 1) x hop``
#: fitted to the median time of its 64 KB-or-smaller all-reduces on 2, 4 and 8 GPUs (10.4, 15.6
#: and 26.0 us; aiconfigurator's CUDA-event times carry no launch skew, unlike Vidur's)
B200_LATENCY = {"base_us": 7.8, "hop_us": 1.3}


class Collectives:
    """Collective times over ``ranks`` GPUs of a :class:`Topology`, in ms (0 for one rank).

    The ranks fill nodes ``ranks_per_node`` at a time (default: as many as a node holds);
    ``stride`` apart: rank ``k`` of a group is GPU ``i + k x stride`` (a data-parallel group of
    one tensor-parallel index ``i``: vLLM numbers GPUs tensor-parallel first), so a group of GPUs
    in one node may still span its islands.

    Byte counts follow nccl-tests: an all-reduce's buffer, an all-gather's *output* (every
    rank ends with it), a reduce-scatter's *input*, the bytes each rank sends in an all-to-all
    (its whole buffer, a ``1 / n`` share to each peer including itself), one message of a
    send/recv.
    """

    def __init__(self, topology: Topology, ranks: int, ranks_per_node: int | None = None, stride: int = 1):
        if ranks < 1:
            raise ConfigError(f"collectives need at least one rank, got {ranks}")
        self.topology = t = topology
        self.ranks = ranks
        per_node = min(ranks, t.gpus_per_node if ranks_per_node is None else ranks_per_node)
        if not 1 <= per_node <= t.gpus_per_node or ranks % per_node:
            raise ConfigError(f"topology {t.name!r}: {ranks} ranks do not fill nodes {per_node} at a time "
                              f"(nodes of {t.gpus_per_node} GPUs)")
        self.nodes = ranks // per_node
        island = t.island_size
        # whether every group's GPUs in a node share an island (GPUs i, i + stride, ...)
        inside = per_node <= island and all((i + (per_node - 1) * stride) // island == i // island
                                            for i in range(stride))
        # _bus: the all-reduce's bus bandwidth (NVLS's where NCCL runs it); _ring: a ring's
        # (all-gather, reduce-scatter) and all-to-all's, never NVLS's (Topology.ring_bus_gbps)
        if inside:
            self._link, self._bus = LINK_CLASS[t.link], t.island_bus_gbps(per_node)
            self._ring = t.ring_bus_gbps(per_node)
            self._p2p = t.p2p_gbps or t.island_bus_gbps(2)
        else:  # the ring leaves its island: the slower link sets the pace
            slow = t.cross_island_gbps if t.cross_island_gbps is not None else t.bus_gbps
            self._link = LINK_CLASS[t.cross_island_link]
            self._bus = min(t.island_bus_gbps(island), slow)
            self._ring = min(t.ring_bus_gbps(island), slow)
            self._p2p = min(t.p2p_gbps or t.island_bus_gbps(2), slow)  # (a send between islands: their link)
        self._per_node = per_node
        # NCCL's own estimate picks the protocol inside an island of one node (its LL ceiling too)
        self._nccl_bus = t.nccl_bus_gbps if self.nodes == 1 and inside else None
        self._ll_max = t.nccl_ll_max_gbps if self.nodes == 1 else None
        if self.nodes > 1:
            if t.network_gbps is None:
                give = (f"interconnect = {{like = \"{t.name}\", network_gbps = 25}}" if t.name in TOPOLOGIES
                        else "network_gbps = 25 in the interconnect table")
                raise ConfigError(f"topology {t.name!r}: {ranks} ranks span {self.nodes} nodes of "
                                  f"{t.gpus_per_node} GPUs but it declares no network_gbps (the link between "
                                  f"nodes): give one, {give}, or keep the layout within a node")
            self._bus = min(self._bus, t.network_gbps)
            self._ring = min(self._ring, t.network_gbps)
            self._p2p = t.network_gbps

    # --- the algorithms ---------------------------------------------------------------------

    def _base(self, algorithm: str, protocol: str) -> float:
        if self.topology.base_us is not None:
            return self.topology.base_us
        return BASE_US[algorithm][protocol]

    def _hop(self, algorithm: str, protocol: str) -> float:
        if self.topology.hop_us is not None:
            return self.topology.hop_us
        return HOP_US[self._link][algorithm][protocol]

    def _net_hop(self, algorithm: str, protocol: str) -> float:
        if self.topology.network_hop_us is not None:
            return self.topology.network_hop_us
        return HOP_US["network"][algorithm][protocol]

    def _protocols(self) -> tuple[str, ...]:
        # LL128 is enabled by default only over NVLink (tuning.cc: typeIntra <= PATH_NVB).
        return PROTOCOLS if self._link == "nvlink" and self.nodes == 1 else ("LL", "Simple")

    @staticmethod
    def _rate_gbps(protocol: str, bus_gbps: float, ll128_share: float, ll_max: float | None) -> float:
        """Bus bandwidth a protocol carries as data: LL half the bus (at most ``ll_max``),
        LL128 ``ll128_share`` of it, Simple all of it."""
        if protocol == "LL":
            return 0.5 * bus_gbps if ll_max is None else min(0.5 * bus_gbps, ll_max)
        return bus_gbps * (ll128_share if protocol == "LL128" else 1.0)

    def _ring_us(self, nbytes: float, steps: int, inter_steps: int, share: float, bus_gbps: float,
                 tuned: bool = False) -> float:
        """A ring of ``steps`` hops (``inter_steps`` of them between nodes) moving ``share x
        nbytes`` over each GPU's link, in the fastest protocol -- or, for a ``tuned`` collective
        on a topology that gives NCCL's own bandwidth estimate, in the protocol NCCL's model
        picks (``topoGetAlgoInfo``), at the measured rates."""
        nccl = self._nccl_bus if tuned else None
        ll128 = self.topology.ll128_share if nccl is not None and self.topology.ll128_share is not None \
            else NCCL_LL128_SHARE
        best, pick = math.inf, math.inf
        for p in self._protocols():
            latency = self._base("ring", p) + (steps - inter_steps) * self._hop("ring", p) \
                + inter_steps * self._net_hop("ring", p)
            ll_max = self._ll_max if tuned else None
            us = latency + share * nbytes / (self._rate_gbps(p, bus_gbps, ll128, ll_max) * 1e3)
            if nccl is None:
                best = min(best, us)
                continue
            # NCCL's model: its latency constants, its bandwidth; the time: the measured ones
            nccl_us = latency + share * nbytes / (self._rate_gbps(p, nccl, NCCL_LL128_SHARE, ll_max) * 1e3)
            if nccl_us < pick:
                extra = self.topology.simple_extra_us + steps * self.topology.simple_extra_hop_us if p == "Simple" \
                    else 0.0
                best, pick = us + extra, nccl_us
        return best

    def _tree_us(self, nbytes: float) -> float:
        """Tree all-reduce across nodes (NCCL's double binary tree): a reduce up and a
        broadcast down, ``log2(nodes)`` network hops each way; algorithm bandwidth half the bus,
        LL's 1 / 3.8 of it (NCCL's tree LL, not the ring's half)."""
        best = math.inf
        for p in ("LL", "Simple"):
            latency = self._base("tree", p) + 2 * ((self._per_node - 1) * self._hop("tree", p)
                                                + math.log2(self.nodes) * self._net_hop("tree", p))
            bw = self._bus * TREE_EFFICIENCY * TREE_PROTOCOL_EFFICIENCY[p]
            best = min(best, latency + 2.0 * nbytes / (bw * 1e3))
        return best

    # --- collectives ------------------------------------------------------------------------

    def all_reduce_ms(self, nbytes: float) -> float:
        """Every rank ends with the sum of all ranks' ``nbytes`` buffers."""
        n = self.ranks
        if n == 1:
            return 0.0
        us = self._ring_us(nbytes, 2 * (n - 1), 2 * (self.nodes - 1), 2.0 * (n - 1) / n, self._bus, tuned=True)
        if self.nodes > 1:
            us = min(us, self._tree_us(nbytes))
        return us * 1e-3

    def all_gather_ms(self, nbytes: float) -> float:
        """Every rank ends with all ranks' ``nbytes / n`` pieces (``nbytes`` of output); a ring
        at the ring's bus bandwidth (not NVLS's, see the module docstring)."""
        n = self.ranks
        if n == 1:
            return 0.0
        return self._ring_us(nbytes, n - 1, self.nodes - 1, (n - 1) / n, self._ring, tuned=True) * 1e-3

    def reduce_scatter_ms(self, nbytes: float) -> float:
        """Rank ``i`` ends with the sum of every rank's ``i``-th piece of its ``nbytes`` buffer."""
        return self.all_gather_ms(nbytes)

    def all_to_all_ms(self, nbytes: float) -> float:
        """Every rank sends a ``1 / n`` share of its ``nbytes`` to every other rank at once
        (NCCL: one send/recv pair per peer, grouped), e.g. MoE expert-parallel dispatch; at the
        ring's bus bandwidth (send/recv is never NVLS)."""
        n = self.ranks
        if n == 1:
            return 0.0
        inter = 1 if self.nodes > 1 else 0
        return self._ring_us(nbytes, 1, inter, (n - 1) / n, self._ring) * 1e-3

    def send_recv_ms(self, nbytes: float) -> float:
        """One rank sends ``nbytes`` to another (e.g. activations between pipeline stages;
        across nodes when the ranks span them)."""
        if self.ranks == 1:
            return 0.0
        return self._ring_us(nbytes, 1, 1 if self.nodes > 1 else 0, 1.0, self._p2p) * 1e-3


# --- presets ----------------------------------------------------------------------------------

def _d(key: str, coll: str, ranks: int, per_node: int) -> float:
    return DERIVATION[(key, coll, ranks, per_node)]


#: NCCL's ring over PCIe with peer-to-peer, measured: the 4-GPU all-reduces of Vidur's
#: NVLink-pair boxes leave their pairs over PCIe (Gen5 on H100, Gen4 on A100). NCCL's own
#: topology model rates a x16 link at 48 (Gen5) and 24 (Gen4) GB/s (topo.cc ``kvDictPciGen``).
PCIE_P2P_GBPS = {"gen5": _d("h100_pairwise_nvlink", "all_reduce", 4, 4),
                 "gen4": _d("a100_pairwise_nvlink", "all_reduce", 4, 4)}
#: Without peer-to-peer NCCL moves data through pinned host memory (SHM transport): the sender's
#: SMs write it, the receiver's SMs read it back with non-posted PCIe reads through the CPU's
#: root complex, both directions at once, on NCCL's default two channels. Measured on the
#: GPU of the shipped TP 2 run: 22.2 GB/s all-reduce bus bandwidth (nccl-tests 32 MB - 2 GB,
#: NCCL defaults) on 8 RTX PRO 6000 Blackwell Server Edition in a dual AMD EPYC Turin server,
#: where NCCL's defaults send the GPU pairs that meet in the CPU through SHM
#: (github.com/voipmonitor/rtx6kpro, hardware/pcie-bandwidth.md, "Festr, Default"; 37.6 with
#: 8 channels). That is 0.46 of the Gen5 peer-to-peer ring, as NCCL's maintainers put SHM at
#: about half the PCIe peer-to-peer rate ("9 or 6" GB/s against 12, NVIDIA/nccl#406). Gen4
#: scales by the measured Gen4 / Gen5 peer-to-peer rings.
PCIE_HOST_GBPS = {"gen5": 22.2, "gen4": 22.2 * PCIE_P2P_GBPS["gen4"] / PCIE_P2P_GBPS["gen5"]}
#: Through host memory, a ring of 2 GPUs reaches less bus bandwidth than a ring of 4 or more on the
#: same host (peer-to-peer does not: 21.1 GB/s at 2 GPUs and 21.0 at 4 on the L40S host below).
#: Measured ratios of the all-reduce bus bandwidth at 2 ranks to that at 4, one host each, NCCL's
#: SHM transport (its log says ``via SHM``), at the largest size measured:
SHM_TWO_RANK_MEASURED = {
    "4 x L40S (cloud VM), NCCL 2.31.2, nccl-tests medians of 10 at 256 MB: arms AL (NCCL_P2P_LEVEL=LOC) and Q "
    "(github.com/Robert-N-Myhre/gpu-communication-boundaries-case-study, lab-05-nccl-analysis.txt)": 17.28 / 20.02,
    "4 x L4 (AWS g6.12xlarge), NCCL 2.30.7, NCCL_P2P_DISABLE=1, 64 MiB (github.com/akamaslabs/vllm-benchmark, "
    "studies/18-l4-pd-disaggregation-tps-per-gpu/results/diag-2026-09-24.log)": 3.76 / 5.39,
    "4 x RTX 4090 (docker), nccl-tests at 2 GB (github.com/kalavai-net/kalavai-client, scripts/README.md)": 2.24 / 2.59,
}
#: Their median (0.863): a 2-GPU ring through host memory runs at this share of :data:`PCIE_HOST_GBPS`,
#: measured on 8 GPUs (rings of 4 and 8 are taken alike).
SHM_TWO_RANK_RATIO = statistics.median(SHM_TWO_RANK_MEASURED.values())

def _nvlink_pairs(gpu: str, gen: str, gpus: int = 4) -> Topology:
    """Vidur's 4-GPU boxes: NVLink bridges in pairs, PCIe between the pairs; or a server of
    ``gpus`` such GPUs with the same links (8 H100 PCIe cards in one server is the common way to
    serve at tensor parallel 8: in Vidur's 4-GPU boxes it spans two, over their 3 GB/s network)."""
    folder = f"{gpu}_pairwise_nvlink"
    name = f"nvlink-pairs-{gpu}" + ("" if gpus == 4 else f"-{gpus}gpu")
    box = (f"4 {gpu.upper()} with NVLink bridges in pairs, PCIe {gen.capitalize()} between pairs (Vidur's "
           f"{folder})" if gpus == 4 else f"{gpus} {gpu.upper()} in one server with NVLink bridges in pairs, PCIe "
           f"{gen.capitalize()} between pairs, the links of Vidur's 4-GPU {folder}")
    return Topology(name, link="nvlink", gpus_per_node=gpus, island=2,
                    bus_gbps=_d(folder, "all_reduce", 2, 2), p2p_gbps=_d(folder, "send_recv", 2, 2),
                    network_gbps=_d(folder, "send_recv", 2, 1),
                    cross_island_link="pcie", cross_island_gbps=PCIE_P2P_GBPS[gen],
                    source=f"{box}; bus bandwidths fitted to its NCCL timings (tools/derive_collectives.py)")


#: Cards found in PCIe-only servers, by generation and by whether they reach each other directly.
PCIE_CARDS = {("gen5", True): "H100 PCIe, L40S/RTX PRO servers with P2P on", ("gen4", True): "A100 PCIe, L40S, A6000",
              ("gen5", False): "RTX PRO 6000 / RTX 5090 servers, P2P off",
              ("gen4", False): "RTX 4090, L4 and cloud VMs without P2P"}


def _pcie(gen: str, p2p: bool) -> Topology:
    """PCIe x16 servers, with peer-to-peer (:data:`PCIE_P2P_GBPS`) or through host memory
    (:data:`PCIE_HOST_GBPS`)."""
    how = ("with peer-to-peer", "the NCCL ring across PCIe in Vidur's NVLink-pair boxes (PCIE_P2P_GBPS)") if p2p \
        else ("without peer-to-peer", "NCCL's SHM transport through host memory (PCIE_HOST_GBPS)")
    bus = (PCIE_P2P_GBPS if p2p else PCIE_HOST_GBPS)[gen]
    by_ranks = {} if p2p else {2: bus * SHM_TWO_RANK_RATIO, 4: bus}
    return Topology(f"pcie-{gen}-{'p2p' if p2p else 'host'}", link="pcie" if p2p else "host", gpus_per_node=8,
                    bus_gbps=bus, bus_gbps_by_ranks=by_ranks,
                    source=f"PCIe {gen.capitalize()} x16 {how[0]} ({PCIE_CARDS[gen, p2p]}): {how[1]}"
                           + ("" if p2p else "; 2 GPUs at SHM_TWO_RANK_RATIO of it, measured on three hosts"))


TOPOLOGIES: dict[str, Topology] = {t.name: t for t in (
    Topology("dgx-h100", link="nvlink", gpus_per_node=8, bus_gbps=_d("h100_dgx", "all_reduce", 8, 8),
             bus_gbps_by_ranks={r: _d("h100_dgx", "all_reduce", r, r) for r in (2, 4, 8)},
             p2p_gbps=_d("h100_dgx", "send_recv", 2, 2), network_gbps=_d("h100_dgx", "send_recv", 2, 1),
             **H100_NVLS,
             source="DGX H100: NVSwitch, NVLink 4 (450 GB/s each way per GPU), 8x ConnectX-7 400 Gb/s; bus "
                    "bandwidths fitted to Vidur's NCCL timings (tools/derive_collectives.py); all-reduces of 5 "
                    "or more GPUs are NVLS's, the other collectives take the ring's (H100_NVLS)"),
    Topology("dgx-a100", link="nvlink", gpus_per_node=8, bus_gbps=_d("a100_dgx", "all_reduce", 8, 8),
             bus_gbps_by_ranks={r: _d("a100_dgx", "all_reduce", r, r) for r in (2, 4, 8)},
             p2p_gbps=_d("a100_dgx", "send_recv", 2, 2), network_gbps=_d("a100_dgx", "send_recv", 2, 1),
             **A100_NCCL, **NCCL_PROTOCOLS_FIT["a100_dgx"],
             source="DGX A100: NVSwitch, NVLink 3 (300 GB/s each way per GPU); bus bandwidths, LL128's share of "
                    "them and the network of Vidur's A100 cluster (8 GB/s per GPU pair, below the datasheet's 8x "
                    "200 Gb/s HDR) fitted to Vidur's NCCL timings (tools/derive_collectives.py); protocols as "
                    "NCCL's tuner picks them (A100_NCCL)"),
    Topology("dgx-b200", link="nvlink", gpus_per_node=8, bus_gbps=_d("b200_dgx", "all_reduce", 8, 8),
             bus_gbps_by_ranks={r: _d("b200_dgx", "all_reduce", r, r) for r in (2, 4, 8)}, **B200_LATENCY,
             source="DGX/HGX B200: NVSwitch, NVLink 5 (900 GB/s each way per GPU); latency and bus bandwidths "
                    "fitted to NVIDIA aiconfigurator's NCCL 2.29.2 timings (tools/derive_collectives.py)"),
    *(_nvlink_pairs(gpu, gen) for gpu, gen in (("h100", "gen5"), ("a100", "gen4"))),
    _nvlink_pairs("h100", "gen5", gpus=8),
    *(_pcie(gen, p2p) for p2p in (True, False) for gen in ("gen5", "gen4")),
)}

#: The machine a GPU preset is usually found in, when a cost model names no ``interconnect``.
GPU_DEFAULT_TOPOLOGY = {
    "a100-40gb": "dgx-a100", "a100-80gb": "dgx-a100", "h100-80gb": "dgx-h100", "h200-141gb": "dgx-h100",
    "gh200-96gb": "dgx-h100", "b200": "dgx-b200", "h100-pcie-80gb": "nvlink-pairs-h100-8gpu", "l4": "pcie-gen4-host",
    "rtx-pro-6000": "pcie-gen5-host", "rtx-pro-6000-server": "pcie-gen5-host", "rtx-4090": "pcie-gen4-host",
    "a40": "pcie-gen4-p2p", "l40s": "pcie-gen4-p2p", "a10g": "pcie-gen4-host",
}


def topology(spec: str | Mapping[str, Any], *, where: str = "interconnect") -> Topology:
    """A preset by name, or a custom machine from a table (keys: :class:`Topology`'s fields;
    ``like = "<preset>"`` starts from a preset and changes the keys given).

    :raises ConfigError: unknown preset (naming the known ones) or a bad key or value.
    """
    if isinstance(spec, str):
        found = TOPOLOGIES.get(spec) or TOPOLOGIES.get(spec.lower())
        if found is None:
            raise ConfigError(f"{where}: unknown interconnect {spec!r}; known: {', '.join(sorted(TOPOLOGIES))} "
                              f"(or a table with link, bus_gbps, ...)")
        return found
    table = dict(spec)
    base = table.pop("like", None)
    fields = {a.name for a in attrs.fields(Topology)}
    for key in table:
        if key not in fields:
            hint = difflib.get_close_matches(key, [*fields, "like"], n=1)
            also = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"{where}: unknown key {key!r}{also}; valid keys: like, {', '.join(sorted(fields))}")
    try:
        if base is not None:
            return attrs.evolve(topology(base, where=where), **{"name": f"{base} (changed)", **table})
        return Topology(**{"name": "custom", **table})
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.name}: {exc.message}") from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def interconnect_field():
    """A cost-model setting naming the machine's links: a :data:`TOPOLOGIES` preset or a table."""

    def check(_inst, attribute, value):
        if value is not None and not isinstance(value, (str, dict)):
            raise FieldError(attribute.name, f"must be a preset name or a table, got {value!r}")

    return attrs.field(default=None, validator=check, metadata={
        "help": "the machine's GPU links: " + ", ".join(sorted(TOPOLOGIES)) + " or a table (link, bus_gbps, "
                "gpus_per_node, ...; like = <preset> to change one); unset: the GPU preset's usual machine"})


def machine(interconnect: str | Mapping[str, Any] | None, gpu, *, link_gbps: float | None = None,
            link_latency_us: float | None = None, where: str = "interconnect") -> Topology:
    """The topology a cost model communicates over.

    ``interconnect`` (a preset name or a table) if given; else the usual machine of the GPU
    preset (:data:`GPU_DEFAULT_TOPOLOGY`); else one link built from the GPU spec's
    ``interconnect_gbps`` (NVLink when set, else PCIe at ``host_link_gbps``) with its
    ``interconnect_latency_us`` as the fixed cost of a collective. ``link_gbps`` replaces the bus
    bandwidth everywhere in the node, ``link_latency_us`` the fixed cost of a collective (the
    settings ``schedlab calibrate`` can fit).

    :raises ConfigError: nothing to build it from, or a bad preset or table.
    """
    if interconnect is not None:
        found = topology(interconnect, where=where)
    elif gpu is not None and gpu.name in GPU_DEFAULT_TOPOLOGY:
        found = TOPOLOGIES[GPU_DEFAULT_TOPOLOGY[gpu.name]]
    elif gpu is not None:
        found = Topology(f"{gpu.name} link", link="nvlink" if gpu.interconnect_gbps is not None else "pcie",
                         bus_gbps=gpu.link_gbps, base_us=gpu.interconnect_latency_us, hop_us=0.0,
                         source=f"GPU {gpu.name!r}: interconnect_gbps / host_link_gbps and interconnect_latency_us")
    elif link_gbps is not None:
        found = Topology("link", link="pcie", bus_gbps=link_gbps, hop_us=0.0, base_us=0.0)
    else:
        raise ConfigError(f"{where}: tensor_parallel > 1 needs the machine's links: set interconnect = "
                          f"<{' | '.join(sorted(TOPOLOGIES))}> (or gpu = <preset>, or link_gbps)")
    changes: dict[str, Any] = {}
    if link_gbps is not None:
        changes.update(bus_gbps=link_gbps, bus_gbps_by_ranks=(), p2p_gbps=None, cross_island_gbps=None)
    if link_latency_us is not None:
        changes.update(base_us=link_latency_us)
    return attrs.evolve(found, **changes) if changes else found
