#!/usr/bin/python3
"""TLS, mutual TLS and the KV-store's roles (issue 16), checked with code we
did not write: certificates from the openssl CLI, calls from Python grpcio.

  1. The KV-store's bulk port speaks TLS with the same files and roles
     (rpc/socket_tls.h): the worker's loads and the scheduler's lookups go
     over it; Python's ssl module loads a block there with the worker's
     certificate and gets the block's bytes, the scheduler's certificate is
     PERMISSION_DENIED naming the method, and a plain-TCP client, a client
     without a certificate and one of another CA get no answer.
  2. KV-store, worker and scheduler run with mutual TLS, each with its own
     certificate (a /tandem/<role> URI SAN). A Generate over TLS gives
     llama2.c's reference tokens; the worker stored blocks and the scheduler
     looked them up, so both roles passed the store's checks.
  3. Roles (one table for every method, rpc/method_roles.h; the processes
     run with --tls-trust-domain tandem.test): a visitor's certificate (same
     CA, no Tandem role) and the wrong role get PERMISSION_DENIED from Store,
     Lookup and Stats, and nothing is written. A worker's certificate
     stores; a worker URI under another trust domain cannot. The worker's
     Describe is for the scheduler role only; Generate for the frontend and
     client roles only.
  4. The scheduler takes cache_salt from the frontend role only (a client
     certificate is INVALID_ARGUMENT with a salt, served without); so
     tandem-frontend with the frontend certificate and tenant API keys
     (--api-keys-file) serves each tenant its own prefix cache: the same
     prompt from another tenant has no cached tokens, and the same tokens.
  5. No client certificate, a certificate of another CA, and plain text are
     refused at the handshake; `tandem info` works with the flags and fails
     without them.
  5b. Bad files at a reload (issue 29), in the KV-store, worker, scheduler
     and the frontend's gRPC identity: an empty key (truncated in place), a
     garbage certificate, a truncated key and another pair's key each count
     once in tandem_tls_reload_failures_total, the process stays up and new
     connections get the last good pair; a rotation written as two files
     (certificate, then key) ends on the new pair (tandem_tls_reloads_total).
  6. Rotation: the store's certificate, key and CA files are replaced (a new
     CA); within a few reload intervals new connections use them, with no
     restart: the new CA's client gets in, the old one's is refused.
  7. The frontend's HTTP port over HTTPS (--https-cert/--https-key, client
     certificates demanded with --https-ca), checked with Python's ssl and
     http.client: a completion and an SSE stream give the same text as over
     the plain port; plain HTTP, a client without a certificate and a client
     that does not trust the server's CA are refused; the certificate
     rotates without a restart.

Usage: tls_test.py BUILD_DIR SOURCE_DIR SHARED_DIR
"""
import json
import os
import re
import http.client as httpclient
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_bulk_load_test import bulk_load, compile_protos, crc32c  # noqa: E402

BLOCK = 4096


def run(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def make_ca(d, name):
    key, pem = os.path.join(d, f"{name}.key"), os.path.join(d, f"{name}.pem")
    run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", pem, "-days", "2", "-subj", f"/CN={name}"])
    return key, pem


def make_cert(d, ca, name, role, domain="tandem.test"):
    """A leaf for 127.0.0.1 with URI SAN spiffe://<domain>/tandem/<role>."""
    key, csr, pem = (os.path.join(d, f"{name}.{e}") for e in ("key", "csr", "pem"))
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write("basicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth,clientAuth\n"
                f"subjectAltName=IP:127.0.0.1,DNS:localhost,URI:spiffe://{domain}/tandem/{role}\n")
    run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", csr, "-subj", f"/CN={name}"])
    run(["openssl", "x509", "-req", "-in", csr, "-CA", ca[1], "-CAkey", ca[0], "-CAcreateserial",
         "-out", pem, "-days", "2", "-extfile", ext])
    return {"cert": pem, "key": key, "ca": ca[1]}


def flags(c):
    return ["--tls-cert", c["cert"], "--tls-key", c["key"], "--tls-ca", c["ca"],
            "--tls-reload-interval-s", "1", "--tls-trust-domain", "tandem.test"]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def channel(port, c=None, ca=None, plain=False):
    if plain:
        return grpc.insecure_channel(f"127.0.0.1:{port}")
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(ca or c["ca"]),
        private_key=read(c["key"]) if c else None,
        certificate_chain=read(c["cert"]) if c else None)
    return grpc.secure_channel(f"127.0.0.1:{port}", creds)


def expect_code(code, fn, what):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"{what}: {e.code()} {e.details()}"
        return e.details()
    raise AssertionError(f"{what}: succeeded, expected {code}")


class Procs:
    def __init__(self, tmp):
        self.tmp, self.procs = tmp, []

    def start(self, name, cmd):
        port_file = os.path.join(self.tmp, f"{name}.port")
        log = open(os.path.join(self.tmp, f"{name}.log"), "w")
        p = subprocess.Popen(cmd + ["--listen", "127.0.0.1:0", "--port-file", port_file],
                             stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, p))
        for _ in range(6000):
            if os.path.exists(port_file) and open(port_file).read().strip():
                return int(open(port_file).read())
            if p.poll() is not None:
                raise AssertionError(f"{name} exited: " + open(log.name).read()[-2000:])
            time.sleep(0.01)
        raise AssertionError(f"{name}: no port file")

    def stop(self):
        for _, p in reversed(self.procs):
            p.terminate()
        for _, p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    def dump(self):
        for name, _ in self.procs:
            sys.stderr.write(f"---- {name}.log\n")
            sys.stderr.write(open(os.path.join(self.tmp, f"{name}.log")).read()[-3000:])


def main():
    build_dir, source_dir, shared_dir = sys.argv[1:4]
    if shutil.which("openssl") is None:
        raise SystemExit("openssl CLI missing (tools/install-deps.sh installs it)")
    tmp = tempfile.mkdtemp(prefix="tandem_tls_")
    compile_protos(source_dir, tmp, ["common", "generation", "kvstore", "worker"])
    from tandem.v1 import common_pb2, generation_pb2 as gen, generation_pb2_grpc as gen_grpc
    from tandem.v1 import kvstore_pb2 as kv, kvstore_pb2_grpc as kv_grpc
    from tandem.v1 import worker_pb2, worker_pb2_grpc

    certs = os.path.join(tmp, "certs")
    os.makedirs(certs)
    ca, ca2 = make_ca(certs, "ca"), make_ca(certs, "ca2")
    c = {role: make_cert(certs, ca, role, role)
         for role in ("kvstore", "worker", "scheduler", "frontend", "visitor", "client")}
    foreign = make_cert(certs, ca, "foreign", "worker", domain="other.test")  # role, wrong domain
    rogue = make_cert(certs, ca2, "rogue", "scheduler")      # the right role, another CA
    kvstore2 = make_cert(certs, ca2, "kvstore2", "kvstore")  # the rotation's new identity
    scheduler2 = make_cert(certs, ca2, "scheduler2", "scheduler")
    # The store reads its files from here; step 6 replaces them in place.
    live = {"cert": os.path.join(tmp, "kv.pem"), "key": os.path.join(tmp, "kv.key"),
            "ca": os.path.join(tmp, "kv-ca.pem")}
    for k in live:
        shutil.copy(c["kvstore"][k], live[k])

    bin_kv = os.path.join(build_dir, "services/kvstore/tandem-kvstore")
    procs = Procs(tmp)
    try:
        kv_port = procs.start("kvstore", [bin_kv, "--data-dir", os.path.join(tmp, "data")] +
                              flags(live))
        w_port = procs.start("worker", [
            os.path.join(build_dir, "services/worker/tandem-worker"),
            "--model", os.path.join(shared_dir, "models/random32k.bin"),
            "--kvstore", f"127.0.0.1:{kv_port}"] + flags(c["worker"]))
        s_port = procs.start("scheduler", [
            os.path.join(build_dir, "services/scheduler/tandem-scheduler"),
            "--worker", f"127.0.0.1:{w_port}", "--kvstore", f"127.0.0.1:{kv_port}"] +
            flags(c["scheduler"]))

        # 2. Generate over mutual TLS: the reference tokens.
        with open(os.path.join(shared_dir, "models", "random32k.reference.json")) as f:
            ref = json.load(f)[0]
        n = 40
        assert len(ref["expected_output_token_ids"]) >= n
        gen_stub = gen_grpc.GenerationStub(channel(s_port, c["frontend"]))

        def generate(stub, salt="", n=n):
            req = gen.GenerateRequest(
                prompt_token_ids=ref["prompt_token_ids"], cache_salt=salt,
                sampling=common_pb2.SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            out = []
            for m in stub.Generate(req, timeout=30):
                out.extend(m.token_ids)
            return out

        deadline = time.time() + 60
        while True:
            try:
                got = generate(gen_stub)
                break
            except grpc.RpcError as e:  # the scheduler waits for the worker's model
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() > deadline:
                    raise
                time.sleep(0.2)
        assert got == ref["expected_output_token_ids"][:n], (got, ref["expected_output_token_ids"][:n])
        print(f"Generate over mutual TLS: {n} tokens equal llama2.c's reference")

        kv_sched = kv_grpc.KvStoreStub(channel(kv_port, c["scheduler"]))
        # A new prompt of whole blocks makes the scheduler look its prefix up.
        req = gen.GenerateRequest(prompt_token_ids=[1] + list(range(100, 132)),
                                  sampling=common_pb2.SamplingParams(max_tokens=2))
        for _ in range(500):
            st = kv_sched.Stats(kv.StatsRequest(), timeout=10)
            if st.stores > 0 and st.bulk_lookups > 0:
                break
            list(gen_stub.Generate(req, timeout=30))
            time.sleep(0.02)
        assert st.stores > 0 and st.bulk_lookups > 0, st
        assert st.bulk_load_port != 0, "a TLS store advertises no bulk port"
        print(f"KV-store over mutual TLS: the worker stored {st.stores} blocks, the scheduler "
              f"made {st.lookups} lookups, {st.bulk_lookups} of them on the TLS bulk port "
              f"{st.bulk_load_port}")

        # 3. Roles.
        kv_visitor = kv_grpc.KvStoreStub(channel(kv_port, c["visitor"]))
        kv_worker = kv_grpc.KvStoreStub(channel(kv_port, c["worker"]))
        block = bytes(range(256)) * (BLOCK // 256)
        crc = crc32c(block)
        chunk = kv.StoreChunk(block_hash=b"\x07" * 32, total_size=BLOCK, data=block, last=True,
                              checksum=crc)

        def store(stub, ns):
            return stub.Store(iter([kv.StoreRequest(namespace=ns, chunks=[chunk])]), timeout=10)

        PD = grpc.StatusCode.PERMISSION_DENIED
        expect_code(PD, lambda: kv_visitor.CreateNamespace(kv.CreateNamespaceRequest(
            info=kv.NamespaceInfo(name="tls", block_bytes=BLOCK)), timeout=10),
            "visitor CreateNamespace")
        kv_worker.CreateNamespace(kv.CreateNamespaceRequest(
            info=kv.NamespaceInfo(name="tls", block_bytes=BLOCK)), timeout=10)
        msg = expect_code(PD, lambda: store(kv_visitor, "tls"), "visitor Store")
        assert "worker role" in msg and "visitor" in msg, msg
        expect_code(PD, lambda: store(kv_sched, "tls"), "scheduler Store")
        expect_code(PD, lambda: kv_visitor.Stats(kv.StatsRequest(), timeout=10), "visitor Stats")
        lookup = kv.LookupRequest(namespace="tls", block_hashes=[b"\x07" * 32])
        expect_code(PD, lambda: kv_worker.Lookup(lookup, timeout=10), "worker Lookup")
        expect_code(PD, lambda: kv_visitor.Lookup(lookup, timeout=10), "visitor Lookup")
        hits = kv_sched.Lookup(lookup, timeout=10).num_hits
        assert hits == 0, "a denied Store wrote the block"
        resp = store(kv_worker, "tls")
        assert len(resp.blocks) == 1 and resp.blocks[0].ok, resp
        hits = kv_sched.Lookup(lookup, timeout=10).num_hits
        assert hits == 1, hits
        msg = expect_code(PD, lambda: store(kv_grpc.KvStoreStub(channel(kv_port, foreign)), "tls"),
                          "foreign trust domain Store")
        assert "other.test" in msg, msg
        for who in ("frontend", "worker", "visitor"):
            expect_code(PD, lambda: worker_pb2_grpc.WorkerStub(channel(w_port, c[who])).Describe(
                worker_pb2.DescribeRequest(), timeout=10), f"{who} Describe")
        worker_pb2_grpc.WorkerStub(channel(w_port, c["scheduler"])).Describe(
            worker_pb2.DescribeRequest(), timeout=10)
        for who in ("scheduler", "visitor"):
            expect_code(PD, lambda: generate(gen_grpc.GenerationStub(channel(s_port, c[who])), n=8),
                        f"{who} Generate")
        print("roles: visitor, wrong-role and foreign-trust-domain calls PERMISSION_DENIED with "
              "nothing written; the worker role stores, the scheduler role looks up and alone "
              "may Describe the worker; Generate only for frontend and client")

        # 1. The bulk port under TLS, spoken by Python's ssl module.
        def bulk_tls(who, ca=None):
            ctx = ssl.create_default_context(cafile=ca or c["worker"]["ca"])
            if who is not None:
                ctx.load_cert_chain(who["cert"], who["key"])
            raw = socket.create_connection(("127.0.0.1", st.bulk_load_port), timeout=10)
            sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            sock.sendall(b"TKVBULK1")
            return sock

        sock = bulk_tls(c["worker"])
        got, done = bulk_load(sock, kv, "tls", [b"\x07" * 32])
        assert done.status_code == 0 and got == {0: block}, (done, got)
        version = sock.version()
        assert version in ("TLSv1.2", "TLSv1.3"), version
        sock.close()
        sock = bulk_tls(c["scheduler"])
        got, done = bulk_load(sock, kv, "tls", [b"\x07" * 32])
        assert done.status_code == 7 and not got, (done, got)  # PERMISSION_DENIED
        assert "KvStore/Load" in done.status_message and "scheduler" in done.status_message, done
        sock.close()

        def refused(fn, what):
            try:
                sock = fn()
                got, done = bulk_load(sock, kv, "tls", [b"\x07" * 32])
            except (OSError, EOFError, ssl.SSLError) as e:
                return str(e)
            raise AssertionError(f"{what}: answered {done}")

        def plain():
            sock = socket.create_connection(("127.0.0.1", st.bulk_load_port), timeout=10)
            sock.sendall(b"TKVBULK1")
            return sock

        for fn, what in ((plain, "plain TCP"), (lambda: bulk_tls(None), "no client certificate"),
                         (lambda: bulk_tls(rogue), "another CA's client")):
            print(f"bulk port under TLS: {what} refused ({refused(fn, what)[:80]})")
        print(f"bulk port under TLS ({version}): Python's ssl loads the worker's block "
              "with the worker's certificate; the scheduler's is PERMISSION_DENIED")

        # 4. cache_salt from the frontend role only.
        salted = generate(gen_stub, salt="tenant-a", n=8)
        assert salted == ref["expected_output_token_ids"][:8], salted
        gen_client = gen_grpc.GenerationStub(channel(s_port, c["client"]))
        msg = expect_code(grpc.StatusCode.INVALID_ARGUMENT,
                          lambda: generate(gen_client, salt="tenant-a", n=8), "client salt")
        assert "cache_salt" in msg, msg
        assert generate(gen_client, n=8) == salted  # unsalted: allowed
        print("cache_salt: taken from the frontend role, INVALID_ARGUMENT from the client role")

        keys = os.path.join(tmp, "keys")
        with open(keys, "w") as f:
            f.write("# key tenant\nsk-a tenant-a\n\nsk-b tenant-b\n")
        f_port = procs.start("frontend", [
            os.path.join(build_dir, "services/frontend/tandem-frontend"),
            "--scheduler", f"127.0.0.1:{s_port}", "--api-keys-file", keys,
            "--tokenizer", os.path.join(shared_dir, "models/tokenizer.model")] +
            flags(c["frontend"]))
        for _ in range(3000):
            if http(f_port, "/health")[0] == 200:
                break
            time.sleep(0.02)
        prompt = "Once upon a time there was a little girl who loved to play in the park. " * 3
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}

        def cached(key):
            status, r = http(f_port, "/v1/completions", body, key)
            assert status == 200, (status, r)
            return r["usage"]["prompt_tokens_details"]["cached_tokens"], r["choices"][0]["text"]

        a1, a2, b1, b2 = cached("sk-a"), cached("sk-a"), cached("sk-b"), cached("sk-b")
        assert a1[0] == 0 and a2[0] > 0, (a1, a2)
        assert b1[0] == 0 and b2[0] > 0, ("tenant b saw tenant a's cache", b1, b2)
        assert a1[1] == a2[1] == b1[1] == b2[1]
        assert http(f_port, "/v1/completions", body)[0] == 401
        assert http(f_port, "/v1/completions", body, "sk-c")[0] == 401
        print(f"tenants through tandem-frontend (frontend role): tenant a cached {a2[0]} tokens "
              f"on its second request, tenant b 0 on its first; the same text")

        # 5. Refused at the handshake.
        UN = grpc.StatusCode.UNAVAILABLE
        stats_req = kv.StatsRequest()
        expect_code(UN, lambda: kv_grpc.KvStoreStub(channel(kv_port, ca=c["worker"]["ca"]))
                    .Stats(stats_req, timeout=5), "no client certificate")
        expect_code(UN, lambda: kv_grpc.KvStoreStub(channel(kv_port, rogue, ca=ca[1]))
                    .Stats(stats_req, timeout=5), "another CA's certificate")
        expect_code(UN, lambda: kv_grpc.KvStoreStub(channel(kv_port, plain=True))
                    .Stats(stats_req, timeout=5), "plain text")
        cli = os.path.join(build_dir, "tools/cli/tandem")
        r = subprocess.run([cli, "info", "--server", f"127.0.0.1:{s_port}"] + flags(c["frontend"]),
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "vocab_size" in r.stdout, (r.returncode, r.stdout, r.stderr)
        r = subprocess.run([cli, "info", "--server", f"127.0.0.1:{s_port}"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0, "tandem info over plain text reached a TLS scheduler"
        # `tandem health`: the Helm chart's probes under TLS (the kubelet's
        # gRPC probe cannot speak it), with the part's own certificate.
        for port, service in ((kv_port, "tandem.v1.KvStore"), (w_port, "tandem.liveness"),
                              (s_port, "tandem.v1.Generation")):
            r = subprocess.run([cli, "health", "--server", f"127.0.0.1:{port}", "--service",
                                service] + flags(c["kvstore"]),
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0 and r.stdout.strip() == "SERVING", (service, r.stdout, r.stderr)
        r = subprocess.run([cli, "health", "--server", f"127.0.0.1:{kv_port}"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, ("tandem health over plain text", r.returncode, r.stderr)
        print("handshake: no certificate, another CA and plain text refused; `tandem info` and "
              "`tandem health` (the chart's TLS probes) work with --tls-*, fail without")

        # 5b. Bad TLS files at a reload keep each process's last good pair.
        cli_health = lambda port, service: subprocess.run(
            [cli, "health", "--server", f"127.0.0.1:{port}", "--service", service] +
            flags(c["kvstore"]), capture_output=True, text=True, timeout=30)
        for i, (name, files, port, service, role) in enumerate((
                ("kvstore", live, kv_port, "tandem.v1.KvStore", "kvstore"),
                ("worker", c["worker"], w_port, "tandem.liveness", "worker"),
                ("scheduler", c["scheduler"], s_port, "tandem.v1.Generation", "scheduler"),
                ("frontend", c["frontend"], None, None, "frontend"))):
            url = (f"http://127.0.0.1:{f_port}/metrics" if name == "frontend" else
                   re.search(r"metrics on (\S+)", open(os.path.join(tmp, f"{name}.log")).read())[1])
            new = make_cert(certs, ca, f"{name}-b", role)
            good = {k: read(files[k]) for k in ("key", "cert")}
            key0 = good["key"]
            bad = (("an empty key", "key", b"", True),
                   ("a garbage certificate", "cert", b"-----BEGIN CERTIFICATE-----\ngarbage\n", False),
                   ("a truncated key", "key", key0[:len(key0) // 2], False),
                   ("another pair's key", "key", read(c["visitor"]["key"]), False),
                   ("the new certificate before its key", "cert", read(new["cert"]), False))
            for what, k, text, in_place in bad:
                n = counter(url, "tandem_tls_reload_failures_total")
                if in_place:
                    open(files[k], "wb").close()  # an in-place writer's first step
                else:
                    write_atomically(files[k], text)
                wait_until(lambda: counter(url, "tandem_tls_reload_failures_total") > n,
                           f"{name}: {what} never counted")
                assert counter(url, "tandem_tls_reload_failures_total") == n + 1, (name, what)
                assert procs.procs[i][1].poll() is None, f"{name} exited on {what}"
                if port is not None:  # a new connection, with the last good pair
                    r = cli_health(port, service)
                    assert r.stdout.strip() == "SERVING", (name, what, r.stdout, r.stderr)
                else:
                    assert http(f_port, "/v1/completions", body, "sk-a")[0] == 200, (name, what)
                if not what.startswith("the new"):
                    write_atomically(files[k], good[k])
            # The rotation's second write: the key. Then the new pair serves.
            n = counter(url, "tandem_tls_reloads_total")
            write_atomically(files["key"], read(new["key"]))
            wait_until(lambda: counter(url, "tandem_tls_reloads_total") > n,
                       f"{name}: the two-write rotation never took effect")
            assert port is None or cli_health(port, service).stdout.strip() == "SERVING", name
        assert generate(gen_stub, n=8) == ref["expected_output_token_ids"][:8]
        print("bad TLS files at a reload (empty, garbage, truncated, mismatched) in the KV-store, "
              "worker, scheduler and frontend: each counted once, no process exited, new "
              "connections served; two-write rotations ended on the new pairs")

        # 6. Rotation without a restart: a new CA, and the store's new identity.
        for k, src in (("ca", ca2[1]), ("key", kvstore2["key"]), ("cert", kvstore2["cert"])):
            shutil.copy(src, live[k] + ".new")
            os.replace(live[k] + ".new", live[k])
        t0 = time.time()
        while True:
            try:
                kv_grpc.KvStoreStub(channel(kv_port, scheduler2)).Stats(stats_req, timeout=5)
                break
            except grpc.RpcError:
                assert time.time() - t0 < 30, "the rotated certificates never took effect"
                time.sleep(0.2)
        expect_code(UN, lambda: kv_grpc.KvStoreStub(channel(kv_port, c["scheduler"]))
                    .Stats(stats_req, timeout=5), "the old CA after rotation")
        assert procs.procs[0][1].poll() is None, "the store restarted"
        print(f"rotation: new CA and identity in effect after {time.time() - t0:.1f} s without a "
              f"restart; the old CA's client is refused")

        # 7. HTTPS on the frontend's own port.
        web = {"cert": os.path.join(tmp, "web.pem"), "key": os.path.join(tmp, "web.key")}
        for k in web:
            shutil.copy(c["frontend"][k], web[k])
        h_port = procs.start("frontend-https", [
            os.path.join(build_dir, "services/frontend/tandem-frontend"),
            "--scheduler", f"127.0.0.1:{s_port}", "--api-keys-file", keys,
            "--tokenizer", os.path.join(shared_dir, "models/tokenizer.model"),
            "--https-cert", web["cert"], "--https-key", web["key"],
            "--https-ca", ca[1]] + flags(c["frontend"]))
        trusting = ssl.create_default_context(cafile=ca[1])
        trusting.load_cert_chain(c["visitor"]["cert"], c["visitor"]["key"])
        for _ in range(3000):
            if https(h_port, "/health", trusting)[0] == 200:
                break
            time.sleep(0.02)
        status, r = https(h_port, "/v1/completions", trusting, body, "sk-a")
        assert status == 200 and r["choices"][0]["text"] == a1[1], (status, r)
        streamed = https_stream(h_port, trusting, dict(body, stream=True), "sk-a")
        assert streamed == a1[1], (streamed, a1[1])
        assert http(h_port, "/health")[0] == -1, "plain HTTP reached the HTTPS port"
        no_cert = ssl.create_default_context(cafile=ca[1])
        assert https(h_port, "/health", no_cert)[0] == -1, "HTTPS without a client certificate"
        other_ca = ssl.create_default_context(cafile=ca2[1])
        other_ca.load_cert_chain(c["visitor"]["cert"], c["visitor"]["key"])
        assert https(h_port, "/health", other_ca)[0] == -1, "a client trusted an unknown CA"
        # Rotation: a certificate from ca2 replaces the port's; a client that
        # trusts only ca2 gets in once it is reread, without a restart.
        web2 = make_cert(certs, ca2, "web2", "frontend")
        for k in ("key", "cert"):
            shutil.copy(web2[k], web[k] + ".new")
            os.replace(web[k] + ".new", web[k])
        t0 = time.time()
        while https(h_port, "/health", other_ca)[0] != 200:
            assert time.time() - t0 < 30, "the rotated HTTPS certificate never took effect"
            time.sleep(0.2)
        assert https(h_port, "/health", trusting)[0] == -1, "the old certificate is still served"
        assert procs.procs[-1][1].poll() is None, "the frontend restarted"
        print(f"HTTPS: completion and SSE stream as over HTTP; plain HTTP, no client certificate "
              f"and an unknown CA refused; rotated in {time.time() - t0:.1f} s without a restart")
    except BaseException:
        procs.dump()
        raise
    finally:
        procs.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


def counter(url, name):
    """A counter's value on a Prometheus /metrics page (0 when absent)."""
    with urllib.request.urlopen(url, timeout=10) as r:
        m = re.search(rf"^{name} (\S+)$", r.read().decode(), re.M)
    return float(m[1]) if m else 0.0


def write_atomically(path, data):
    with open(path + ".new", "wb") as f:
        f.write(data)
    os.replace(path + ".new", path)


def wait_until(pred, what, timeout=30):
    t0 = time.time()
    while not pred():
        assert time.time() - t0 < timeout, what
        time.sleep(0.1)


def http(port, path, body=None, key=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return -1, None


def https(port, path, ctx, body=None, key=None):
    """(status, JSON) over HTTPS with `ctx`; (-1, None) when the handshake fails."""
    conn = httpclient.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request("POST" if body is not None else "GET", path,
                     json.dumps(body) if body is not None else None, headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")
    except (ssl.SSLError, ConnectionError, OSError):
        return -1, None
    finally:
        conn.close()


def https_stream(port, ctx, body, key):
    """The text of an SSE completion stream over HTTPS."""
    conn = httpclient.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    r = conn.getresponse()
    assert r.status == 200, r.status
    text, done = "", False
    for line in r:
        line = line.decode().strip()
        if line == "data: [DONE]":
            done = True
            break
        if line.startswith("data: "):
            text += json.loads(line[6:])["choices"][0]["text"]
    conn.close()
    assert done, "the stream ended without [DONE]"
    return text


if __name__ == "__main__":
    main()
