"""A TCP proxy for fault tests: cut the connection to a server (the recorder's database
outage) or stall it (a broker whose produce path answers nothing for a while)."""

from __future__ import annotations

import socket
import struct
import threading

PRODUCE = 0  # Kafka's api key of a Produce request


class TcpProxy:
    """A TCP forwarder we can cut (close every connection, refuse new ones) and restore, or
    stall and resume: connections stay open and nothing moves either way on them. With
    `kafka_produce_only`, only Kafka connections that carry Produce requests stall (the
    path of a broker that cannot take writes): heartbeats, fetches and commits go on."""

    def __init__(self, target: tuple[str, int], port: int | None = None):
        self.target = target
        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.port = port
        self.conns: list[socket.socket] = []
        self.listener: socket.socket | None = None
        self.flowing = threading.Event()
        self.flowing.set()
        self.produce_only = False
        self.restore()

    def stall(self, kafka_produce_only: bool = False) -> None:
        self.produce_only = kafka_produce_only
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    def restore(self) -> None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self.listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.conns += [client, upstream]
            conn = {"produces": False, "buf": b""}
            for a, b, out in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(a, b, conn, out), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn: dict, outbound: bool) -> None:
        try:
            while data := src.recv(65536):
                if outbound and not conn["produces"]:
                    conn["produces"] = _carries_produce(conn, data)
                if not (self.produce_only and not conn["produces"]):
                    self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        if self.listener is not None:
            try:  # NOTE: shutdown wakes the thread blocked in accept(); close alone does not
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self.conns = []


def _carries_produce(conn: dict, data: bytes) -> bool:
    """Whether the client's bytes so far hold a Produce request (frames: int32 size, then
    int16 api key)."""
    buf = conn["buf"] + data
    while len(buf) >= 6:
        size, key = struct.unpack(">ih", buf[:6])
        if key == PRODUCE:
            return True
        if len(buf) < 4 + size:
            break
        buf = buf[4 + size:]
    conn["buf"] = buf
    return False
