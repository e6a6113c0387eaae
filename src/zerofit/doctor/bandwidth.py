"""A timed TCP transfer between two nodes: the bandwidth ``zerofit doctor --measure-bandwidth``
reports and writes to the cluster-facts file.

The receiver (``BandwidthServer``) listens on the address the launch will use (in
``--allocation``: the interface NCCL_SOCKET_IFNAME selects, else the one that routes to the main
node). The sender (``measure_to``) opens ``streams`` TCP connections to it from its own such
address, proves on each that it reached a
zerofit receiver (``ZEROFIT-BANDWIDTH <token> <session> <streams>`` answered by ``OK``), then
streams zeros on all of them until ``seconds`` pass or ``max_bytes`` are sent, whichever comes
first. The receiver times what it receives, from the first data byte of any stream to the last
byte of the last one, so the bytes a sender's socket buffer still holds when it stops are
counted when they arrive, not when they were queued, and answers ``RESULT <bytes> <seconds>``.

Several streams, because one TCP stream in one Python thread is bounded by one core's copies
and by the per-flow hashing of bonded or ECMP links, long before a 25-400 Gbit/s NIC is; NCCL's
own socket transport opens several sockets per peer for the same reason
(NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD). Every socket call has a bounded timeout, so a
dead or silent peer ends the measurement with a one-line message, never a hang.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

HELLO = "ZEROFIT-BANDWIDTH"
HELLO_BYTES = 256  # the hello line is padded to this length: the receiver reads it exactly
SECONDS = 2.0  # per pair: TCP reaches full rate within milliseconds at a datacenter's RTT
# A bound on the bytes as well as the time: 2 GiB still take 0.17 s at 100 Gbit/s, long enough
# to time, and keep a fast unshaped link from copying gigabytes for the full two seconds.
MAX_BYTES = 2 * 1024**3
STREAMS = 4
CHUNK = 256 * 1024  # one send: short enough that the deadline is checked often on slow links


class BandwidthError(Exception):
    """A measurement that did not complete; the message is one line that names the fix."""


@dataclass(frozen=True)
class Transfer:
    """What a receiver counted: ``nbytes`` received over ``seconds`` (first to last byte)."""

    nbytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        """The rate in Gbit/s (10^9 bits per second, as NICs are sold)."""
        return rate_gbps(self.nbytes, self.seconds)


def rate_gbps(nbytes: int, seconds: float) -> float:
    """``nbytes`` in ``seconds`` as Gbit/s (decimal giga, 8 bits per byte)."""
    if seconds <= 0:
        raise ValueError(f"a transfer needs a positive duration, not {seconds!r} s")
    return nbytes * 8 / seconds / 1e9


def slowest_pair(pairs: list[dict]) -> dict:
    """The measured pair with the lowest ``gbps``: what a ring collective's every step waits on."""
    measured = [p for p in pairs if p.get("gbps") is not None]
    if not measured:
        raise ValueError("no pair was measured")
    return min(measured, key=lambda p: p["gbps"])


# --- receiver -------------------------------------------------------------------------------------
class _Session:
    """The streams of one sender: each handler adds its count, then all answer together."""

    def __init__(self, streams: int, timeout: float):
        self.streams = streams
        self.barrier = threading.Barrier(streams, timeout=timeout)
        self.lock = threading.Lock()
        self.counts: list[tuple[int, float, float]] = []  # (bytes, first byte at, last byte at)

    def add(self, nbytes: int, first: float | None, last: float | None) -> None:
        if nbytes and first is not None and last is not None:
            with self.lock:
                self.counts.append((nbytes, first, last))

    def total(self) -> Transfer | None:
        with self.lock:
            if not self.counts:
                return None
            nbytes = sum(c[0] for c in self.counts)
            seconds = max(c[2] for c in self.counts) - min(c[1] for c in self.counts)
        return Transfer(nbytes, seconds) if seconds > 0 else None


class BandwidthServer:
    """Receives timed transfers on ``host``; ``port`` 0 picks a free port (see ``.port``).

    ``start(sessions)`` accepts in a background thread until that many senders finished;
    ``wait`` joins it with a bound and closes the socket. Results are kept in ``received``
    (one dict per session: the peer's address, bytes, seconds, Gbit/s, or the error).
    """

    def __init__(self, host: str, token: str, port: int = 0, timeout: float = 10.0):
        self.token, self.timeout = token, timeout
        self.received: list[dict] = []
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._finished = 0
        self._expected = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise BandwidthError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}) (fix: the address must "
                "belong to this node; pass the main node's address with --main-addr)"
            ) from None
        self._sock.listen(64)
        self.host, self.port = host, self._sock.getsockname()[1]

    def start(self, sessions: int = 1) -> BandwidthServer:
        """Accept senders in the background until ``sessions`` of them finished."""
        self._expected = sessions
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float) -> list[dict]:
        """Wait up to ``timeout`` s for the expected senders, then stop; return ``received``."""
        if self._thread is not None:
            self._thread.join(max(0.0, timeout))
        self.close()
        with self._lock:
            return list(self.received)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)  # the accept loop polls the stop flag every 0.2 s
        self._sock.close()

    def _accept_loop(self) -> None:
        self._sock.settimeout(0.2)
        handlers = []
        while not self._stop.is_set():
            with self._lock:
                if self._finished >= self._expected:
                    break
            try:
                conn, peer = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:  # closed by ``close``
                break
            handler = threading.Thread(target=self._handle, args=(conn, peer[0]), daemon=True)
            handler.start()
            handlers.append(handler)
        join_by = time.monotonic() + self.timeout * 2 + 1  # handlers: socket and barrier timeouts
        for handler in handlers:
            handler.join(max(0.0, join_by - time.monotonic()))

    def _handle(self, conn: socket.socket, peer: str) -> None:
        with conn:
            conn.settimeout(self.timeout)
            try:
                hello = _recv_exactly(conn, HELLO_BYTES).decode("ascii", "replace").strip()
            except OSError:
                return
            head, _, rest = hello.partition(" ")
            parts = rest.rsplit(" ", 2)
            if head != HELLO or len(parts) != 3 or not parts[2].isdigit():
                return  # not a zerofit sender: say nothing
            token, session_id, streams = parts[0], parts[1], int(parts[2])
            try:
                if token != self.token or not 1 <= streams <= 64:
                    conn.sendall(b"BAD-TOKEN\n")
                    return
                with self._lock:
                    session = self._sessions.setdefault(
                        session_id, _Session(streams, self.timeout)
                    )
                conn.sendall(b"OK\n")
            except OSError:  # the sender left already
                return
            nbytes, first, last, error = _receive_until_eof(conn)
            session.add(nbytes, first, last)
            try:
                index = session.barrier.wait()
            except threading.BrokenBarrierError:
                error = error or f"only some of the {streams} streams arrived"
                index = -1
            total = session.total()
            if error is None and total is None:
                error = "too little data to time"
            reply = (
                f"RESULT {total.nbytes} {total.seconds:.6f}\n"
                if error is None and total is not None
                else f"ERROR {error}\n"
            )
            try:
                conn.sendall(reply.encode())
            except OSError:
                pass
            if index in (0, -1):  # one handler per session records it
                self._record(session_id, peer, total, error)

    def _record(self, session_id: str, peer: str, total: Transfer | None, error) -> None:
        with self._lock:
            if any(r["session"] == session_id for r in self.received):
                return
            entry = {"session": session_id, "peer": peer, "error": error}
            if error is None and total is not None:
                entry.update(nbytes=total.nbytes, seconds=total.seconds, gbps=total.gbps)
            self.received.append(entry)
            self._finished += 1


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed before the hello was complete")
        data += chunk
    return data


def _receive_until_eof(conn: socket.socket) -> tuple[int, float | None, float | None, str | None]:
    """(bytes, first byte at, last byte at, error) of one stream, read until the sender closes."""
    buffer = bytearray(1024 * 1024)
    nbytes, first, last = 0, None, None
    try:
        while True:
            got = conn.recv_into(buffer)
            now = time.monotonic()
            if not got:
                return nbytes, first, last, None
            if first is None:
                first = now
            nbytes, last = nbytes + got, now
    except socket.timeout:
        return nbytes, first, last, "the sender went silent"
    except OSError as exc:
        return nbytes, first, last, f"the stream broke ({exc.strerror or exc})"


# --- sender ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """How long and how much one measurement may stream, on how many TCP streams, and how long
    one socket call waits on a silent peer."""

    seconds: float = SECONDS
    max_bytes: int = MAX_BYTES
    streams: int = STREAMS
    timeout: float = 10.0


def measure_to(
    addr: str, port: int, token: str, limits: Limits = Limits(), source: str | None = None
) -> Transfer:
    """Stream to a ``BandwidthServer`` on ``addr:port`` within ``limits`` and return what it
    received; with ``source``, from that local address (so the streams leave on its interface).

    Raises ``BandwidthError`` (one line, with the fix) when the peer cannot be reached, is not a
    zerofit receiver, goes silent for ``limits.timeout`` s, or breaks the connection.
    """
    seconds, streams, timeout = limits.seconds, limits.streams, limits.timeout
    where = f"{addr}:{port}"
    session = os.urandom(6).hex()
    conns = []
    try:
        for _ in range(streams):
            conns.append(_open_stream(addr, port, where, timeout, source))
        for conn in conns:
            _send_hello(conn, where, token, session, streams)
        errors: list[str] = []
        sent = [0] * streams
        deadline = time.monotonic() + seconds
        threads = [
            threading.Thread(
                target=_stream,
                args=(conn, deadline, limits.max_bytes // streams, sent, index, errors),
                daemon=True,
            )
            for index, conn in enumerate(conns)
        ]
        for thread in threads:
            thread.start()
        join_by = time.monotonic() + seconds + timeout + 5  # each send is bounded by the timeout
        for thread in threads:
            thread.join(max(0.0, join_by - time.monotonic()))
        if errors or any(t.is_alive() for t in threads):
            sent_mb = sum(sent) / 1e6
            problem = errors[0] if errors else f"a send stalled for {timeout:g} s"
            raise BandwidthError(
                f"the transfer to {where} broke after {sent_mb:.1f} MB: {problem} "
                "(fix: the peer's doctor stopped or the link dropped; check that node)"
            )
        return _read_result(conns[0], where, timeout)
    finally:
        for conn in conns:
            conn.close()


def _open_stream(
    addr: str, port: int, where: str, timeout: float, source: str | None
) -> socket.socket:
    bind_to = (source, 0) if source else None
    try:
        conn = socket.create_connection((addr, port), timeout=timeout, source_address=bind_to)
    except ConnectionRefusedError:
        raise BandwidthError(
            f"nothing listens on {where} (fix: that node's doctor is not running or already "
            "stopped; start `zerofit doctor --allocation` on every node together)"
        ) from None
    except socket.timeout:
        raise BandwidthError(
            f"no answer from {where} within {timeout:g} s (fix: a firewall drops the packets or "
            "the address is not reachable from this node)"
        ) from None
    except OSError as exc:
        raise BandwidthError(
            f"cannot reach {where}: {exc.strerror or exc} (fix: check the address and the route)"
        ) from None
    conn.settimeout(timeout)
    return conn


def _send_hello(conn: socket.socket, where: str, token: str, session: str, streams: int) -> None:
    hello = f"{HELLO} {token} {session} {streams}".encode()
    if len(hello) > HELLO_BYTES - 1:
        raise BandwidthError(
            f"--token is too long (fix: use at most {HELLO_BYTES // 2} characters)"
        )
    try:
        conn.sendall(hello.ljust(HELLO_BYTES))
        reply = _read_line(conn)
    except socket.timeout:
        raise BandwidthError(
            f"{where} accepted but never answered (fix: another service holds that port, "
            "or that node's doctor hangs)"
        ) from None
    except OSError as exc:
        raise BandwidthError(
            f"{where} closed the connection ({exc.strerror or exc}) (fix: another service holds "
            "that port)"
        ) from None
    if reply == "BAD-TOKEN":
        raise BandwidthError(
            f"{where} answered with a different --token (fix: use the same --token on all nodes)"
        )
    if reply != "OK":
        raise BandwidthError(
            f"{where} is another service, not zerofit's receiver (fix: check the address)"
        )


def _stream(conn, deadline: float, budget: int, sent: list[int], index: int, errors) -> None:
    """Send zeros until ``deadline`` or ``budget`` bytes, then close the sending side."""
    payload = memoryview(bytes(CHUNK))
    try:
        while sent[index] < budget and time.monotonic() < deadline:
            size = min(CHUNK, budget - sent[index])
            conn.sendall(payload[:size])
            sent[index] += size
        conn.shutdown(socket.SHUT_WR)
    except socket.timeout:
        errors.append("a send stalled past the timeout")
    except OSError as exc:
        errors.append(exc.strerror or str(exc))


def _read_result(conn: socket.socket, where: str, timeout: float) -> Transfer:
    try:
        reply = _read_line(conn)
    except socket.timeout:
        raise BandwidthError(
            f"{where} did not report what it received within {timeout:g} s "
            "(fix: that node's doctor hangs; check it)"
        ) from None
    except OSError as exc:
        raise BandwidthError(
            f"{where} closed before reporting ({exc.strerror or exc}) (fix: check that node)"
        ) from None
    words = reply.split()
    if len(words) == 3 and words[0] == "RESULT":
        try:
            return Transfer(int(words[1]), float(words[2]))
        except ValueError:
            pass
    if words and words[0] == "ERROR":
        problem = reply[len("ERROR ") :]
        raise BandwidthError(f"{where} could not time the transfer: {problem} (fix: run again)")
    raise BandwidthError(f"{where} answered {reply[:40]!r}, not a result (fix: check the address)")


def _read_line(conn: socket.socket, limit: int = 200) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = conn.recv(1)
        if not chunk:
            break
        data += chunk
    return data.decode("ascii", "replace").strip()
