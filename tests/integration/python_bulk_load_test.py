#!/usr/bin/python3
"""The KV-store's bulk load port spoken by a client that is not ours.

Starts tandem-kvstore, then with nothing but Python's socket module, Debian's
protobuf runtime and grpcio (the message classes compiled by grpc_tools from
protos/tandem/v1/kvstore.proto):
  1. creates a namespace and stores blocks over gRPC, with checksums computed
     by a CRC32C written here from its definition (polynomial 0x82F63B78),
  2. finds the bulk load port in Stats, follows the protocol as
     services/kvstore/bulk_load_server.h documents it, and checks every
     block's bytes and checksum, a miss, and the final status,
  3. checks that the gRPC Load stream answers the same bytes, and that
     lookups on a lookup connection answer as gRPC Lookup does,
  4. checks the errors: an unknown namespace, a hash of the wrong length, a
     connection without the preface; and that a corrupt-block report of an
     intact block is checked and the block kept.

Usage: python_bulk_load_test.py BUILD_DIR SOURCE_DIR
"""
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

BLOCK = 64 << 10
PREFACE = b"TKVBULK1"
LOOKUP_PREFACE = b"TKVLOOK1"


def compile_protos(source_dir, out_dir, names):
    """Python message and gRPC classes of protos/tandem/v1/<name>.proto into
    out_dir (grpc_tools' protoc), importable as tandem.v1.*."""
    rc = protoc.main(["protoc", f"-I{source_dir}/protos", f"--python_out={out_dir}",
                      f"--grpc_python_out={out_dir}"] +
                     [f"{source_dir}/protos/tandem/v1/{n}.proto" for n in names])
    assert rc == 0, f"protoc failed on {names}"
    sys.path.insert(0, out_dir)


def crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def payload(i):
    # Cheap, distinct bytes per block (the CRC above is pure Python).
    return (bytes([i, i * 7 & 0xFF, 0x5A, 0xC3]) * (BLOCK // 4))


def block_hash(i):
    return bytes([i]) * 32


def recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError(f"connection closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def send_frame(sock, msg):
    body = msg.SerializeToString()
    sock.sendall(struct.pack("<I", len(body)) + body)


def read_frame(sock, pb2, cls=None):
    (n,) = struct.unpack("<I", recv_exact(sock, 4))
    return (cls or pb2.BulkLoadFrame).FromString(recv_exact(sock, n))


def bulk_load(sock, pb2, ns, hashes):
    """One load: returns ({index: bytes or miss reason}, done frame)."""
    send_frame(sock, pb2.LoadRequest(namespace=ns, block_hashes=hashes))
    got = {}
    while True:
        frame = read_frame(sock, pb2)
        if frame.done:
            return got, frame
        c = frame.chunk
        assert c.last, c
        if c.ok:
            data = recv_exact(sock, c.total_size)
            assert crc32c(data) == c.checksum, f"block {c.block_index}: checksum mismatch"
            got[c.block_index] = data
        else:
            got[c.block_index] = c.miss_reason


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="tandem_pybulk_")
    compile_protos(source_dir, tmp, ["kvstore"])
    from tandem.v1 import kvstore_pb2 as pb2, kvstore_pb2_grpc as pb2_grpc

    port_file = os.path.join(tmp, "port")
    proc = subprocess.Popen([os.path.join(build_dir, "services/kvstore/tandem-kvstore"),
                             "--listen", "127.0.0.1:0", "--port-file", port_file,
                             "--data-dir", os.path.join(tmp, "data")],
                            stdout=open(os.path.join(tmp, "kvstore.log"), "w"),
                            stderr=subprocess.STDOUT)
    try:
        for _ in range(3000):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            assert proc.poll() is None, "tandem-kvstore exited"
            time.sleep(0.01)
        port = int(open(port_file).read())
        stub = pb2_grpc.KvStoreStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

        # 1. Blocks stored over gRPC, checksums from the CRC32C above.
        stub.CreateNamespace(pb2.CreateNamespaceRequest(
            info=pb2.NamespaceInfo(name="py", block_bytes=BLOCK)), timeout=10)
        chunks = [pb2.StoreChunk(block_hash=block_hash(i), total_size=BLOCK, data=payload(i),
                                 last=True, checksum=crc32c(payload(i))) for i in (1, 2, 3)]
        resp = stub.Store(iter([pb2.StoreRequest(namespace="py", chunks=chunks)]), timeout=10)
        assert len(resp.blocks) == 3 and all(s.ok for s in resp.blocks), resp

        # 2. The bulk load port, found in Stats.
        bulk_port = stub.Stats(pb2.StatsRequest(), timeout=10).bulk_load_port
        assert bulk_port != 0, "Stats advertises no bulk load port"
        sock = socket.create_connection(("127.0.0.1", bulk_port), timeout=10)
        sock.sendall(PREFACE)
        hashes = [block_hash(3), block_hash(9), block_hash(1), block_hash(2)]  # 9: never stored
        got, done = bulk_load(sock, pb2, "py", hashes)
        assert done.status_code == 0, done
        assert got[0] == payload(3) and got[2] == payload(1) and got[3] == payload(2)
        assert got[1] == pb2.MISS_REASON_NOT_FOUND, got[1]
        print("bulk load port: 3 blocks and 1 miss, bytes and CRC32C as stored")

        # 3. The gRPC stream answers the same.
        grpc_got = {}
        for msg in stub.Load(pb2.LoadRequest(namespace="py", block_hashes=hashes), timeout=10):
            for c in msg.chunks:
                if c.ok:
                    grpc_got[c.block_index] = grpc_got.get(c.block_index, b"") + c.data
                else:
                    grpc_got[c.block_index] = c.miss_reason
        assert grpc_got == got, "the gRPC Load stream answered differently"
        print("gRPC Load stream: the same answer")

        # 3b. Lookups on a lookup connection: several sent before any answer
        # is read, answered in order, as the gRPC Lookup answers them.
        look = socket.create_connection(("127.0.0.1", bulk_port), timeout=10)
        look.sendall(LOOKUP_PREFACE)
        asks = [([block_hash(1), block_hash(2), block_hash(9), block_hash(3)], False),
                ([block_hash(3), block_hash(1)], True),
                ([block_hash(9)], False)]
        for hashes_i, lease in asks:
            send_frame(look, pb2.LookupRequest(namespace="py", block_hashes=hashes_i,
                                               take_lease=lease))
        answers = [read_frame(look, pb2, pb2.BulkLookupAnswer) for _ in asks]
        for (hashes_i, lease), a in zip(asks, answers):
            assert a.status_code == 0, a
            want = stub.Lookup(pb2.LookupRequest(namespace="py", block_hashes=hashes_i),
                               timeout=10)
            assert a.response.num_hits == want.num_hits, (a, want)
            assert (a.response.lease_id != 0) == (lease and want.num_hits > 0), a
        assert [a.response.num_hits for a in answers] == [2, 2, 0], answers
        # The lease rides back on the next lookup, as over gRPC.
        send_frame(look, pb2.LookupRequest(namespace="nope", block_hashes=[block_hash(1)],
                                           release_lease_ids=[answers[1].response.lease_id]))
        a = read_frame(look, pb2, pb2.BulkLookupAnswer)
        assert a.status_code == 5 and "nope" in a.status_message, a
        assert stub.Stats(pb2.StatsRequest(), timeout=10).active_leases == 0
        send_frame(look, pb2.LookupRequest(namespace="py", block_hashes=[b"short"]))
        a = read_frame(look, pb2, pb2.BulkLookupAnswer)
        assert a.status_code == 3 and "block_hashes[0]" in a.status_message, a
        look.close()
        print("lookup connection: 3 pipelined lookups answered in order as gRPC answers them; "
              "a lease released; NOT_FOUND and INVALID_ARGUMENT")

        # 4. Errors. The same connection: an unknown namespace, then a bad hash.
        got, done = bulk_load(sock, pb2, "nope", [block_hash(1)])
        assert not got and done.status_code == 5 and "nope" in done.status_message, done
        got, done = bulk_load(sock, pb2, "py", [block_hash(1), b"short"])
        assert not got and done.status_code == 3, done
        assert "block_hashes[1]" in done.status_message, done
        got, done = bulk_load(sock, pb2, "py", [block_hash(2)])  # still usable
        assert done.status_code == 0 and got[0] == payload(2)
        # A corrupt-block report of an intact block: the store checks it and
        # keeps it (the report is answered like a load with no blocks).
        send_frame(sock, pb2.LoadRequest(namespace="py", corrupt_block_hashes=[block_hash(2)]))
        done = read_frame(sock, pb2)
        assert done.done and done.status_code == 0, done
        got, done = bulk_load(sock, pb2, "py", [block_hash(2)])
        assert done.status_code == 0 and got[0] == payload(2), "an intact reported block was dropped"
        stats = stub.Stats(pb2.StatsRequest(), timeout=10)
        assert stats.corrupt_reports == 1 and stats.checksum_failures == 0, stats
        sock.close()
        bad = socket.create_connection(("127.0.0.1", bulk_port), timeout=10)
        bad.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert bad.recv(1) == b"", "a connection without the preface was answered"
        print("errors: NOT_FOUND, INVALID_ARGUMENT naming the hash, a bad preface closed; "
              "a report of an intact block refuted")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("python_bulk_load_test: OK")


if __name__ == "__main__":
    main()
