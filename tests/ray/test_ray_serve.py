"""scorekit on a local Ray Serve instance: two replicas of the embedded model behind Ray's HTTP proxy.

One Ray instance serves the whole module (starting it and loading the model twice takes about 30 s on
two cores), with no dashboard, no usage statistics and the two cores. Its node address is loopback (see
conftest.py) and the last test checks that every TCP connection between its processes is on loopback;
Ray's gRPC servers still listen on the wildcard address, which Ray does not let a caller change. Each
replica also answers /health, /load and /metrics on its own probe port, which is how these tests read
one replica's counters. The last test shuts Ray down and counts what is left of it.
Skipped when the `ray` extra is not installed."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
serve = pytest.importorskip("ray.serve")

from scorekit.app import create_app  # noqa: E402
from scorekit.deploy.options import RayOptions  # noqa: E402
from scorekit.deploy.ray import PROXY_READY_CHECK, ScorekitReplica, application, init_ray  # noqa: E402
from scorekit.deploy.replica import ReplicaApp  # noqa: E402
from scorekit.settings import EngineConfig, Settings  # noqa: E402
from tests.live import Live, free_port, wait_for  # noqa: E402

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
REPLICAS = 2
ENVIRONMENT_BEFORE = frozenset(os.environ)  # what the environment set before the cluster started
DEPLOY_TIMEOUT = 180.0  # Ray's start plus two model loads, on a busy 2-core machine
QUERY = "What is the capital of France?"
DOCUMENTS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris.", "Paris is in France."]


@dataclass
class Cluster:
    """The running deployment: Ray's proxy, each replica's probe port, and Ray's process ids."""

    proxy: Live
    probes: list[Live]
    temp_dir: str
    stopped: bool = False

    def ray_pids(self) -> set[int]:
        """Every live process of this Ray instance: those whose command line names its temp dir (raylet,
        GCS, agents), and their descendants (the workers: controller, proxy, replicas)."""
        parents: dict[int, int] = {}
        roots: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            pid = int(entry.name)
            parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
            if self.temp_dir.encode() in command:
                roots.add(pid)
        found = set(roots)
        for _ in range(16):  # the tree is a few levels deep
            more = {pid for pid, parent in parents.items() if parent in found} - found
            if not more:
                break
            found |= more
        return found

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            serve.shutdown()
            ray.shutdown()


def loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def tcp_sockets(pids: set[int]) -> list[tuple[str, str, bool]]:
    """``(local address, remote address, listening)`` for each TCP socket the processes ``pids`` hold."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                found.append((_address(fields[1]), _address(fields[2]), fields[3] == "0A"))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp's ``0100007F:1F90`` as ``127.0.0.1``: its 32-bit words are in host (little-endian) order."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    mapped = getattr(address, "ipv4_mapped", None)  # an IPv4 client of an IPv6 socket
    return str(mapped or address)


def metric(live: Live, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``, from one replica's /metrics."""
    status, _, raw = live.request("GET", "/metrics", timeout=10)
    assert status == 200
    total = 0.0
    for line in raw.decode().splitlines():
        match = re.match(rf"{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if match and all(f'{key}="{value}"' in (match.group(1) or "") for key, value in labels.items()):
            total += float(match.group(2))
    return total


@dataclass(frozen=True)
class Counts:
    """One replica's counters, from its /metrics."""

    batches: float
    items: float
    dropped: float
    completed: float  # /rerank requests answered 200

    @classmethod
    def read(cls, live: Live) -> Counts:
        return cls(
            metric(live, "scorekit_batch_size_count"),
            metric(live, "scorekit_batch_size_sum"),
            metric(live, "scorekit_items_dropped_total"),
            metric(live, "scorekit_requests_total", route="/rerank", status="200"),
        )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp_dir = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths live under it
    port, probe = free_port(), free_port()
    for _ in range(10):  # the probe ports are probe, probe + 1, ...: not the proxy's
        if port not in range(probe, probe + REPLICAS):
            break
        probe = free_port()
    cluster = Cluster(Live("127.0.0.1", port), [Live("127.0.0.1", probe + i) for i in range(REPLICAS)], temp_dir)
    try:
        init_ray(
            "local",
            num_cpus=REPLICAS,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp_dir,
            # The replicas import scorekit from this checkout, whatever the environment has installed.
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}},
            log_to_driver=False,
        )
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # Small batches, so that a large rerank spans many of them and a disconnect has work left to drop.
        settings = Settings.for_model(engine=EngineConfig(max_batch_size=16, max_batch_tokens=4096))
        options = RayOptions(replicas=REPLICAS, num_cpus=1, probe_port=probe)
        serve.run(application(settings, options), name="scorekit", route_prefix="/")
        assert wait_for(lambda: all(_healthy(live) for live in cluster.probes), timeout=DEPLOY_TIMEOUT, interval=0.2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _healthy(live: Live) -> bool:
    try:
        return live.request("GET", "/health", timeout=2)[0] == 200
    except OSError:
        return False


def test_the_instance_s_processes_wait_a_minute_for_a_proxy(cluster: Cluster) -> None:
    """Serve's controller kills a proxy not ready within its ready check (5 s by default), which a busy machine's
    new proxy process can take; the processes of an instance scorekit starts inherit the minute (a task there
    reads it), unless the environment set its own."""
    name, wanted = PROXY_READY_CHECK
    assert os.environ.get(name) == wanted or name in ENVIRONMENT_BEFORE, os.environ.get(name)

    @ray.remote(num_cpus=0)  # the replicas hold the instance's CPUs
    def seen() -> str | None:
        return os.environ.get(name)

    assert ray.get(seen.remote(), timeout=120) == os.environ[name]


def test_scores_through_the_ray_proxy_match_sentence_transformers(cluster: Cluster) -> None:
    from sentence_transformers import SentenceTransformer, util

    from scorekit.models import default_model_path

    status, body = cluster.proxy.json("POST", "/score", {"queries": QUERY, "documents": DOCUMENTS}, timeout=60)
    assert status == 200, body
    reference = SentenceTransformer(default_model_path(), device="cpu")
    embeddings = reference.encode([QUERY, *DOCUMENTS], convert_to_tensor=True, normalize_embeddings=True)
    expected = util.cos_sim(embeddings[0], embeddings[1:])[0].tolist()
    assert [item["score"] for item in body["data"]] == pytest.approx(expected, abs=1e-5)


def test_requests_spread_over_both_replicas(cluster: Cluster) -> None:
    """Ray's router picks between two replicas by their queues, as it last heard them: on a loaded machine a
    replica whose report is late can be passed over for a whole round of twelve, so up to three rounds are sent,
    and each round's requests must all be answered and counted on one replica or the other."""
    served = [0.0, 0.0]
    for _ in range(3):  # bounded: a router that never spreads fails after the third round
        before = [metric(live, "scorekit_requests_total", route="/rerank", status="200") for live in cluster.probes]
        statuses: list[int] = []

        def one(statuses: list[int] = statuses) -> None:
            payload = {"query": QUERY, "documents": DOCUMENTS * 20}
            statuses.append(cluster.proxy.json("POST", "/rerank", payload, timeout=60)[0])

        threads = [threading.Thread(target=one, daemon=True) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert statuses == [200] * 12
        after = [metric(live, "scorekit_requests_total", route="/rerank", status="200") for live in cluster.probes]
        round_served = [b - a for a, b in zip(before, after, strict=True)]
        assert sum(round_served) == 12, f"requests per replica: {round_served}"
        served = [total + more for total, more in zip(served, round_served, strict=True)]
        if min(served) > 0:
            break
    assert min(served) > 0, f"requests per replica over three rounds: {served}"


def test_ray_reports_both_replicas_running_and_healthy(cluster: Cluster) -> None:
    """Ray's periodic health checks call ScorekitReplica.check_health; a replica that failed one would not be
    RUNNING here."""
    deployment = serve.status().applications["scorekit"].deployments["scorekit"]
    assert (deployment.status, dict(deployment.replica_states)) == ("HEALTHY", {"RUNNING": REPLICAS})


def test_check_health_fails_while_a_model_is_not_loaded() -> None:
    replica = ScorekitReplica()
    replica.app = ReplicaApp(create_app(Settings()))  # what serve.ingress sets; its lifespan has not run
    with pytest.raises(RuntimeError, match="is not loaded"):
        replica.check_health()


def test_a_client_that_leaves_at_the_proxy_drops_its_work_on_the_replica(cluster: Cluster) -> None:
    documents = [f"document number {i} talks about topic {i % 17} in some detail" for i in range(2000)]
    before = [Counts.read(live) for live in cluster.probes]
    client = cluster.proxy.send_json("/rerank", {"query": "topic 3", "documents": documents})
    try:
        assert wait_for(lambda: any(live.load() == 1 for live in cluster.probes), timeout=30, interval=0.02)
        busy = next(i for i, live in enumerate(cluster.probes) if live.load() == 1)
        probe = cluster.probes[busy]
        # Its first batches have run: the rest of its 2,000 items are queued behind them.
        assert wait_for(lambda: Counts.read(probe).batches >= before[busy].batches + 2, timeout=30, interval=0.02)
    finally:
        client.close()
    left = time.monotonic()
    assert wait_for(lambda: all(live.load() == 0 for live in cluster.probes), timeout=10, interval=0.01)
    back_to_zero = time.monotonic() - left
    after = [Counts.read(live) for live in cluster.probes]
    dropped = [b.dropped - a.dropped for a, b in zip(before, after, strict=True)]
    assert dropped[busy] > 0 and sum(dropped) == dropped[busy], f"items dropped per replica: {dropped}"
    assert after[busy].completed == before[busy].completed, "the abandoned rerank ran to its end"
    ran = (after[busy].items - before[busy].items) / len(documents)
    print(
        f"\nreplica {busy}: load 0 {back_to_zero * 1000:.0f} ms after the client left; {ran:.0%} of the items ran,"
        f" {dropped[busy]:.0f} dropped"
    )
    for live in cluster.probes:
        assert live.request("GET", "/health")[0] == 200


def test_ray_serve_shuts_down_and_leaves_no_process(cluster: Cluster) -> None:
    """Runs last: it shuts Ray down."""
    running = cluster.ray_pids()
    assert running, "found none of this Ray instance's processes while it runs"
    connections = tcp_sockets(running)
    talking = [(local, remote) for local, remote, listening in connections if not listening]
    assert talking and all(loopback(a) and loopback(b) for a, b in talking), f"beyond loopback: {talking}"
    wildcard = sorted({local for local, _, listening in connections if listening and not loopback(local)})
    cluster.stop()
    assert wait_for(lambda: not cluster.ray_pids(), timeout=20, interval=0.1), f"left behind: {cluster.ray_pids()}"
    print(
        f"\n{len(running)} Ray processes while serving, 0 after shutdown; {len(talking)} TCP connections, all on"
        f" loopback; {len(wildcard)} listeners on a wildcard address: {wildcard}"
    )
    with socket.socket() as sock:  # the proxy's port is free again (its closed connections may linger)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", cluster.proxy.port))
