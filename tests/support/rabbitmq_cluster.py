"""A three-node RabbitMQ cluster on this machine, for the tests that kill a node.

Each node is a ``rabbitmq-server`` of its own (the Debian package's), with its own node name
(``reports-a@localhost``…), AMQP port, distribution port (``RABBITMQ_DIST_PORT``), and data and log
folders (``RABBITMQ_MNESIA_BASE``, ``RABBITMQ_LOG_BASE``) under one temporary folder; nodes ``b``
and ``c`` join ``a`` with ``rabbitmqctl join_cluster``. They use the Erlang cookie of the machine's
own RabbitMQ node (the one ``rabbitmqctl`` reaches as root), so ``rabbitmqctl -n reports-a@localhost
cluster_status`` works from a shell while a test runs. The machine's own node (``rabbit@<host>`` on
5672), which other tests use, is never stopped, reset or reconfigured: the cluster's processes get
an environment file, a configuration file and a plugins file of their own.

Starting the cluster takes about half a minute on two cores (three Erlang VMs booting, then two
joins, which restart each joining node's application); a killed node comes back in about six
seconds with its data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.environment import missing
from tests.support.processes import free_port

#: The scripts of the Debian package, called directly: ``/usr/sbin``'s wrappers switch to the
#: ``rabbitmq`` user, whose home holds the cookie this module copies instead.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
#: The machine's node's Erlang cookie, which ``rabbitmqctl`` uses as root (through that wrapper).
SYSTEM_COOKIE = Path("/var/lib/rabbitmq/.erlang.cookie")

#: The nodes' short names; the first is the one the others join.
NODES = ("a", "b", "c")

#: Every node's ``rabbitmq.conf``: what docs/howto/rabbitmq.md tells an operator to set there. The
#: consumer timeout outlasts any delay a worker holds a message for (the settings cap delays at 6
#: days, this is 7); the memory and disk alarms keep RabbitMQ's defaults.
NODE_CONFIG = "consumer_timeout = 604800000\n"
#: The policy docs/howto/rabbitmq.md tells an operator to set on the vhost: a delivery limit high
#: enough for the returns a message lives through (a kill, a deploy, a lost node each return every
#: message a worker holds), low enough to end a loop of crashes.
DELIVERY_LIMIT_POLICY = ("^(critical|default|bulk)(\\.DQ)?$", '{"delivery-limit": 100}')

#: Seconds a node may take to boot (an Erlang VM and the rabbit application) on a loaded machine.
BOOT_TIMEOUT = 120
#: Seconds one ``rabbitmqctl`` call may take.
CTL_TIMEOUT = 60


@dataclass
class Node:
    short: str
    folder: Path
    amqp_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"reports-{self.short}@localhost"

    def url(self, vhost: str) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/{vhost}"


class Cluster:
    """Three nodes in ``folder``; :func:`running` starts them, joins them and stops them after."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.nodes = {short: Node(short, folder / short) for short in NODES}

    # --- processes ---------------------------------------------------------------------------

    def start(self) -> None:
        for node in self.nodes.values():
            node.folder.mkdir(parents=True)
            (node.folder / "rabbitmq.conf").write_text(NODE_CONFIG)
            self._launch(node)
        for node in self.nodes.values():
            self._await(node)
        first = self.nodes[NODES[0]]
        for node in list(self.nodes.values())[1:]:
            self.ctl("stop_app", node=node)
            self.ctl("join_cluster", first.name, node=node)
            self.ctl("start_app", node=node)

    def kill(self, node: Node) -> None:
        """SIGKILL the node's whole process group (its Erlang VM and helpers), as a crash would."""
        assert node.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait()
        node.process = None

    def revive(self) -> None:
        """Start again every node killed since, with its data: it rejoins the cluster by itself."""
        down = [node for node in self.nodes.values() if node.process is None]
        for node in down:
            self._launch(node)
        for node in down:
            self._await(node)

    def stop(self) -> None:
        # The data is thrown away with the folder: nothing needs a clean shutdown.
        for node in self.nodes.values():
            if node.process is not None:
                self.kill(node)

    def _environment(self) -> dict[str, str]:
        """What every process of the cluster (nodes and ``rabbitmqctl``) runs with: its own cookie
        copy, environment file (not ``/etc/rabbitmq``'s, which names the machine's node) and plugins."""
        return {
            **os.environ,
            "HOME": str(self.folder / "home"),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
        }

    def prepare(self) -> None:
        home = self.folder / "home"
        home.mkdir(parents=True)
        shutil.copyfile(SYSTEM_COOKIE, home / ".erlang.cookie")
        (home / ".erlang.cookie").chmod(0o400)
        # Erlang distribution on the loopback only, as the machine's node has it.
        (self.folder / "rabbitmq-env.conf").write_text(
            'export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"\n'
        )
        (self.folder / "enabled_plugins").write_text("[].\n")

    def _launch(self, node: Node) -> None:
        environment = {
            **self._environment(),
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(node.amqp_port),
            # A new one at each start: the others find it through epmd.
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_CONFIG_FILE": str(node.folder / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node.folder / "advanced.config"),
            "RABBITMQ_MNESIA_BASE": str(node.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node.folder / "log"),
            "RABBITMQ_PID_FILE": str(node.folder / "pid"),
        }
        with (node.folder / "console.log").open("ab") as log:
            node.process = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _await(self, node: Node) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            assert node.process is not None
            if node.process.poll() is not None:
                raise RuntimeError(f"{node.name} exited at start: see {node.folder / 'console.log'}")
            # Fails fast while the VM is not up yet, then waits for the application.
            if self._ctl(["await_startup"], node=node, check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name} did not start within {BOOT_TIMEOUT}s")
            time.sleep(0.5)

    # --- rabbitmqctl -------------------------------------------------------------------------

    def ctl(self, *args: str, node: Node | None = None) -> str:
        """Run ``rabbitmqctl`` against ``node`` (a running one by default); its standard output."""
        return self._ctl(list(args), node=node or self.running_node(), check=True).stdout

    def _ctl(self, args: list[str], *, node: Node, check: bool) -> subprocess.CompletedProcess[str]:
        command = [str(RABBITMQ_BIN / "rabbitmqctl"), "-q", "-n", node.name, *args]
        try:
            return subprocess.run(
                command, env=self._environment(), capture_output=True, text=True, timeout=CTL_TIMEOUT, check=check
            )
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {node.name} failed: {e.stderr.strip()}") from e

    def running_node(self) -> Node:
        return next(node for node in self.nodes.values() if node.process is not None)

    # --- what a test uses --------------------------------------------------------------------

    def new_vhost(self) -> str:
        """A vhost of the caller's own on the cluster, with the documented delivery limit.

        It is not deleted: the cluster is thrown away after the session, and deleting quorum
        queues while a node is down waits for that node, about five seconds a queue.
        """
        name = f"test-{uuid.uuid4().hex[:12]}"
        self.ctl("add_vhost", name)
        self.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        self.ctl("set_policy", "-p", name, "--apply-to", "queues", "reports", *DELIVERY_LIMIT_POLICY)
        return name

    def url(self, vhost: str, *, first: Node) -> str:
        """``BROKER_URL`` listing every node, ``first`` first: a client connects to the first that answers."""
        ordered = [first, *(node for node in self.nodes.values() if node is not first)]
        return ";".join(node.url(vhost) for node in ordered)

    def queues(self, vhost: str) -> dict[str, dict[str, object]]:
        """Each queue of ``vhost`` by name: its ``type``, ``leader``, ``members`` and ``online`` members."""
        rows = json.loads(
            self.ctl("list_queues", "-p", vhost, "name", "type", "leader", "members", "online", "--formatter", "json")
        )
        return {row.pop("name"): row for row in rows}

    def node_named(self, name: str) -> Node:
        return next(node for node in self.nodes.values() if node.name == name)


@contextlib.contextmanager
def running(folder: Path) -> Iterator[Cluster]:
    """A started cluster in ``folder``, stopped after, also when starting it failed half-way.

    Skips locally (fails in CI) when RabbitMQ's scripts or the machine node's cookie are missing.
    """
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        missing("rabbitmq-server is not installed (Debian package rabbitmq-server)")
    if not os.access(SYSTEM_COOKIE, os.R_OK):
        missing(f"the machine's RabbitMQ cookie {SYSTEM_COOKIE} is not readable (run as root)")
    cluster = Cluster(folder)
    cluster.prepare()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
