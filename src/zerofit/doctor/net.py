"""Network facts for `zerofit doctor`: interfaces, the route to the main node, port checks and the
``--serve`` / ``--connect`` handshake that proves one node can reach another's port.

The handshake is one line each way over TCP: the client sends ``ZEROFIT-DOCTOR <token>``, the
server answers ``OK <hostname>`` (or ``BAD-TOKEN``), so a different service that happens to listen
on the port is not mistaken for a working path. Every socket call has a bounded timeout.
"""

from __future__ import annotations

import errno
import fcntl
import socket
import struct
import time
from pathlib import Path

HELLO = "ZEROFIT-DOCTOR"
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def list_interfaces(sys_net: str = "/sys/class/net") -> list[dict]:
    """Every network interface: name, IPv4 addresses, operstate, loopback, speed in Mbit/s."""
    result = []
    for _, name in sorted(socket.if_nameindex(), key=lambda x: x[0]):
        base = Path(sys_net) / name
        state = _read(base / "operstate") or "unknown"
        speed = _read(base / "speed")
        addr = _ipv4_of(name)
        result.append(
            {
                "name": name,
                "addresses": [addr] if addr else [],
                "state": state,
                "loopback": name == "lo" or (addr or "").startswith("127."),
                "speed_mbit": (
                    int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None
                ),
            }
        )
    return result


def list_infiniband(sys_ib: str = "/sys/class/infiniband") -> list[dict]:
    """InfiniBand / RoCE devices with each port's state (empty without any)."""
    devices = []
    for dev in sorted(Path(sys_ib).glob("*")):
        ports = {
            p.name: (_read(p / "state") or "?").split(":")[-1].strip()
            for p in sorted((dev / "ports").glob("*"))
        }
        devices.append({"name": dev.name, "ports": ports})
    return devices


def route_source(addr: str, port: int) -> str | None:
    """The local address this node would use to reach ``addr`` (a UDP connect sends no packet)."""
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((addr, port))
            return s.getsockname()[0]
    except OSError:
        return None


def resolve(addr: str) -> tuple[list[str], str | None]:
    """(addresses, error) for a hostname or IP."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return [], exc.strerror or str(exc)
    return sorted({i[4][0] for i in infos}), None


def port_in_use(port: int, host: str = "") -> str | None:
    """None when ``port`` can be bound here (as the rendezvous store will), else the reason."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # ignore TIME_WAIT leftovers, like TCPStore
        try:
            s.bind((host, port))
        except OSError as exc:
            return "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
    return None


def serve(
    port: int, token: str, timeout: float, host: str = "", ready=None, count: int = 1
) -> tuple[bool, str]:
    """Listen on ``port`` until ``count`` clients complete the handshake or ``timeout`` s pass."""
    deadline = time.monotonic() + timeout
    peers: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((host, port))
        except OSError as exc:
            return False, f"cannot listen on port {port}: {exc.strerror or exc}"
        srv.listen(8)
        if ready is not None:
            ready()
        while (left := deadline - time.monotonic()) > 0:
            srv.settimeout(left)
            try:
                conn, peer = srv.accept()
            except socket.timeout:
                break
            with conn:
                conn.settimeout(min(5.0, max(left, 0.1)))
                try:
                    line = conn.makefile("r").readline().strip()
                except OSError:
                    continue
                if line == f"{HELLO} {token}":
                    conn.sendall(f"OK {socket.gethostname()}\n".encode())
                    peers.append(peer[0])
                    if len(peers) >= count:
                        return (
                            True,
                            f"{', '.join(peers)} reached port {port} and completed the handshake",
                        )
                    continue
                conn.sendall(b"BAD-TOKEN\n")
        if peers:
            return False, (
                f"only {len(peers)} of {count} nodes ({', '.join(peers)}) reached port {port} "
                f"within {timeout:g} s"
            )
        return False, f"no node connected to port {port} within {timeout:g} s"


def connect(addr: str, port: int, token: str, timeout: float) -> tuple[bool, str]:
    """Complete the handshake with a ``serve`` on ``addr:port``.

    Returns (ok, message), the message naming the fix on failure.
    """
    where = f"{addr}:{port}"
    try:
        with socket.create_connection((addr, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(f"{HELLO} {token}\n".encode())
            reply = conn.makefile("r").readline().strip()
    except ConnectionRefusedError:
        return False, (
            f"nothing listens on {where} (fix: run `zerofit doctor --serve {port}` on that node "
            "first; if it is running, a firewall rejects the port)"
        )
    except socket.timeout:
        return False, (
            f"no answer from {where} within {timeout:g} s (fix: a firewall drops the packets or "
            "the address is not reachable from this node; check the route and NCCL_SOCKET_IFNAME)"
        )
    except socket.gaierror as exc:
        return (
            False,
            f"cannot resolve {addr}: {exc.strerror} "
            "(fix: use an IP address or fix DNS / /etc/hosts)",
        )
    except OSError as exc:
        return (
            False,
            f"cannot reach {where}: {exc.strerror or exc} (fix: check the address and the route)",
        )
    if reply.startswith("OK"):
        return True, f"reached {where} ({reply[3:] or 'peer'}) and completed the handshake"
    if reply == "BAD-TOKEN":
        return (
            False,
            f"{where} answered with a different --token (fix: use the same --token on both nodes)",
        )
    return (
        False,
        f"{where} is another service, not `zerofit doctor --serve` (fix: pick a free port)",
    )


def connect_until(addr: str, port: int, token: str, timeout: float) -> tuple[bool, str]:
    """``connect``, retried while nothing listens yet (that node may start later)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        ok, message = connect(addr, port, token, max(1.0, min(5.0, left)))
        if ok or left <= 0 or not message.startswith("nothing listens"):
            return ok, message
        time.sleep(min(0.5, max(left, 0.0)))


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
