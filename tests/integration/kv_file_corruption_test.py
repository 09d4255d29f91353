#!/usr/bin/python3
"""Corrupt RocksDB files under a stopped tandem-kvstore (issue 16).

Blocks are stored over gRPC (grpcio; checksums from the CRC32C written from
its definition in python_bulk_load_test.py) and the store is stopped
cleanly, so they sit in RocksDB's blob and table files. Two rounds, each
ending with a clean stop and a restart on the same directory:
  1. bytes flipped in the middle of every blob file (the blocks' payloads):
     the store starts; every block loads either with exactly the bytes
     stored or as a miss (no corrupt byte is served); the corrupt ones are
     missed and counted, and storing them again heals them;
  2. a byte flipped in every table file (.sst: keys and metadata), which
     stops RocksDB from opening at all: the store repairs the directory
     (RocksDB's RepairDB), starts, and serves nothing corrupt; what was lost
     is stored again (the namespace too, as a worker does on NOT_FOUND) and
     served;
  3. every blob file deleted: the index keeps the keys, the start-up check
     drops the blocks whose payload is gone, and Stats counts them
     (blocks_dropped_at_open, load_failures).

Usage: kv_file_corruption_test.py BUILD_DIR SOURCE_DIR
"""
import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_bulk_load_test import (  # noqa: E402
    BLOCK, block_hash, compile_protos, crc32c, payload)

N = 16


def start(build_dir, tmp, name):
    port_file = os.path.join(tmp, f"{name}.port")
    log = os.path.join(tmp, f"{name}.log")
    proc = subprocess.Popen([os.path.join(build_dir, "services/kvstore/tandem-kvstore"),
                             "--listen", "127.0.0.1:0", "--port-file", port_file,
                             "--data-dir", os.path.join(tmp, "data"),
                             "--hot-capacity-bytes", "0", "--bulk-load-listen", "off"],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(3000):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, int(open(port_file).read())
        assert proc.poll() is None, f"tandem-kvstore exited:\n{open(log).read()[-3000:]}"
        time.sleep(0.01)
    raise AssertionError("tandem-kvstore never listened")


def load_all(stub, pb2):
    """{i: bytes or miss reason} for blocks 1..N."""
    got = {}
    req = pb2.LoadRequest(namespace="c", block_hashes=[block_hash(i) for i in range(1, N + 1)])
    for msg in stub.Load(req, timeout=30):
        for c in msg.chunks:
            i = c.block_index + 1
            if c.ok:
                got[i] = got.get(i, b"") + c.data
            else:
                got[i] = c.miss_reason
    return got


def store(stub, pb2, blocks):
    chunks = [pb2.StoreChunk(block_hash=block_hash(i), total_size=BLOCK, data=payload(i),
                             last=True, checksum=crc32c(payload(i))) for i in blocks]
    resp = stub.Store(iter([pb2.StoreRequest(namespace="c", chunks=chunks)]), timeout=30)
    assert all(s.ok for s in resp.blocks), resp
    return resp


def flip(path, rng, count):
    """Flips `count` bytes in the middle 80% of the file."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for _ in range(count):
            pos = rng.randrange(size // 10, size - size // 10)
            f.seek(pos)
            b = f.read(1)
            f.seek(pos)
            f.write(bytes([b[0] ^ 0xA5]))


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="tandem_kvfile_")
    compile_protos(source_dir, tmp, ["kvstore"])
    from tandem.v1 import kvstore_pb2 as pb2, kvstore_pb2_grpc as pb2_grpc

    proc, port = start(build_dir, tmp, "kv-0")
    try:
        stub = pb2_grpc.KvStoreStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        stub.CreateNamespace(pb2.CreateNamespaceRequest(
            info=pb2.NamespaceInfo(name="c", block_bytes=BLOCK)), timeout=10)
        store(stub, pb2, range(1, N + 1))
        proc.send_signal(signal.SIGTERM)  # a clean stop flushes the blocks to their files
        assert proc.wait(timeout=30) == 0

        data = os.path.join(tmp, "data")
        rng = random.Random(16)
        # flips 0: the files are deleted (a lost volume's blob files).
        for rnd, (pattern, flips) in enumerate((("*.blob", 6), ("*.sst", 1), ("*.blob", 0)),
                                               start=1):
            files = glob.glob(os.path.join(data, pattern))
            assert files, (pattern, os.listdir(data))
            for path in files:
                if flips:
                    flip(path, rng, flips)
                else:
                    os.remove(path)
            proc, port = start(build_dir, tmp, f"kv-{rnd}")
            stub = pb2_grpc.KvStoreStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
            # As a worker does: the namespace again (kept: created False).
            created = stub.CreateNamespace(pb2.CreateNamespaceRequest(
                info=pb2.NamespaceInfo(name="c", block_bytes=BLOCK)), timeout=10).created
            got = load_all(stub, pb2)
            assert sorted(got) == list(range(1, N + 1)), sorted(got)
            served = [i for i, v in got.items() if isinstance(v, bytes)]
            missed = [i for i, v in got.items() if not isinstance(v, bytes)]
            for i in served:
                assert got[i] == payload(i), f"round {rnd}: block {i}: corrupt bytes served"
            assert missed, f"round {rnd}: no block missed although {pattern} was corrupted"
            assert proc.poll() is None, "the store died"
            stats = stub.Stats(pb2.StatsRequest(), timeout=10)
            damage = f"{flips} byte(s) flipped in each of" if flips else "deleted"
            print(f"round {rnd}: {damage} {len(files)} {pattern} file(s); the store started{' (repaired)' if created else ''}; "
                  f"{len(served)} blocks served intact, {len(missed)} missed (checksum "
                  f"failures {stats.checksum_failures}, dropped at open "
                  f"{stats.blocks_dropped_at_open}, load failures {stats.load_failures}); "
                  f"no corrupt byte served")
            # What the store counted, as its Stats (and /metrics) report it.
            if rnd == 1:
                assert stats.checksum_failures == len(missed), stats
            if rnd == 3:
                assert stats.blocks_dropped_at_open + stats.load_failures == len(missed), stats
            store(stub, pb2, missed)
            again = load_all(stub, pb2)
            for i in range(1, N + 1):
                assert again[i] == payload(i), f"round {rnd}: block {i} after the re-store"
            print(f"round {rnd}: re-stored {len(missed)} blocks: all {N} served intact")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
    except BaseException:
        for log in sorted(glob.glob(os.path.join(tmp, "*.log"))):
            sys.stderr.write(f"---- {log}\n{open(log).read()[-3000:]}\n")
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    print("PASS")


if __name__ == "__main__":
    main()
