#!/usr/bin/python3
"""A gRPC client that is not ours: Python grpcio (Debian python3-grpcio).

Starts tandem-worker and tandem-scheduler on free loopback ports, then, with
nothing but grpcio and protoc (grpc_tools):
  1. lists the scheduler's and the worker's services through server
     reflection (v1alpha),
  2. checks grpc.health.v1 health of both (SERVING, overall and per service;
     NOT_FOUND for a service neither serves),
  3. fetches tandem.v1.Generation's descriptors through reflection, builds
     the message classes dynamically and runs a Generate stream, whose
     greedy tokens must match llama2.c's reference for the same prompt;
     does the same for the worker's Describe.

Usage: python_client_test.py BUILD_DIR SHARED_DIR
"""
import json
import socket
import urllib.request
import shutil
import os
import subprocess
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# Minimal wire-compatible subsets of the standard reflection and health protos.
REFLECTION_PROTO = """
syntax = "proto3";
package grpc.reflection.v1alpha;
message ServerReflectionRequest {
  string host = 1;
  oneof message_request {
    string file_by_filename = 3;
    string file_containing_symbol = 4;
    string list_services = 7;
  }
}
message FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }
message ServiceResponse { string name = 1; }
message ListServiceResponse { repeated ServiceResponse service = 1; }
message ErrorResponse { int32 error_code = 1; string error_message = 2; }
message ServerReflectionResponse {
  string valid_host = 1;
  ServerReflectionRequest original_request = 2;
  oneof message_response {
    FileDescriptorResponse file_descriptor_response = 4;
    ListServiceResponse list_services_response = 6;
    ErrorResponse error_response = 7;
  }
}
service ServerReflection {
  rpc ServerReflectionInfo(stream ServerReflectionRequest) returns (stream ServerReflectionResponse);
}
"""
HEALTH_PROTO = """
syntax = "proto3";
package grpc.health.v1;
message HealthCheckRequest { string service = 1; }
message HealthCheckResponse {
  enum ServingStatus { UNKNOWN = 0; SERVING = 1; NOT_SERVING = 2; SERVICE_UNKNOWN = 3; }
  ServingStatus status = 1;
}
service Health { rpc Check(HealthCheckRequest) returns (HealthCheckResponse); }
"""


def compile_protos(tmp):
    for name, text in (("reflection.proto", REFLECTION_PROTO), ("health.proto", HEALTH_PROTO)):
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
        rc = protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                          os.path.join(tmp, name)])
        assert rc == 0, f"protoc failed on {name}"
    sys.path.insert(0, tmp)


def start(argv, log, port_file):
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(3000):
        if os.path.exists(port_file):
            with open(port_file) as f:
                text = f.read().strip()
            if text:
                return proc, int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[0]} exited early; see {log}")
        time.sleep(0.01)
    raise RuntimeError(f"no port file from {argv[0]}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(health_pb2, health_pb2_grpc, channel, timeout=30):
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            r = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
            if r.status == health_pb2.HealthCheckResponse.SERVING:
                return True
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    return False


def reflect(reflection_pb2, reflection_pb2_grpc, channel, symbol):
    """Returns (listed service names, a DescriptorPool holding `symbol`)."""
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    reqs = [reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)]
    responses = list(refl.ServerReflectionInfo(iter(reqs), timeout=10))
    services = sorted(s.name for s in responses[0].list_services_response.service)
    assert not responses[1].HasField("error_response"), responses[1].error_response
    pool = descriptor_pool.DescriptorPool()
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in responses[1].file_descriptor_response.file_descriptor_proto]
    added = set()
    while len(added) < len(files):  # add dependencies first
        progress = False
        for fd in files:
            if fd.name not in added and all(d in added for d in fd.dependency):
                pool.Add(fd)
                added.add(fd.name)
                progress = True
        assert progress, "reflection returned an incomplete dependency set"
    return services, pool


def check_health(health_pb2, health_pb2_grpc, channel, service):
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", service):
        r = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING, (name, r)
    try:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        raise AssertionError("health of an unknown service did not fail")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e


def main():
    build_dir, shared_dir = sys.argv[1], sys.argv[2]
    model = os.path.join(shared_dir, "models", "stories260K.bin")
    with open(os.path.join(shared_dir, "models", "stories260K.reference.json")) as f:
        reference = json.load(f)[0]
    tmp = tempfile.mkdtemp(prefix="tandem-python-")
    compile_protos(tmp)
    import health_pb2, health_pb2_grpc, reflection_pb2, reflection_pb2_grpc

    procs = []
    try:
        worker, wport = start([os.path.join(build_dir, "services/worker/tandem-worker"), "--model", model,
                               "--listen", "127.0.0.1:0", "--port-file", os.path.join(tmp, "w.port")],
                              os.path.join(tmp, "worker.log"), os.path.join(tmp, "w.port"))
        procs.append(worker)
        metrics_port = free_port()
        sched, sport = start([os.path.join(build_dir, "services/scheduler/tandem-scheduler"),
                              "--worker", f"127.0.0.1:{wport}", "--listen", "127.0.0.1:0",
                              "--port-file", os.path.join(tmp, "s.port"),
                              "--metrics-listen", f"127.0.0.1:{metrics_port}"],
                             os.path.join(tmp, "scheduler.log"), os.path.join(tmp, "s.port"))
        procs.append(sched)
        channel = grpc.insecure_channel(f"127.0.0.1:{sport}")

        # 2. Health.
        assert wait_serving(health_pb2, health_pb2_grpc, channel), "scheduler never SERVING"
        print("health: SERVING")

        check_health(health_pb2, health_pb2_grpc, channel, "tandem.v1.Generation")

        # 1. Reflection: list services, then fetch the Generation descriptors.
        services, pool = reflect(reflection_pb2, reflection_pb2_grpc, channel, "tandem.v1.Generation")
        print("services:", services)
        for want in ("tandem.v1.Generation", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection"):
            assert want in services, f"{want} not listed by reflection: {services}"
        factory = message_factory.MessageFactory(pool)
        req_cls = factory.GetPrototype(pool.FindMessageTypeByName("tandem.v1.GenerateRequest"))
        resp_cls = factory.GetPrototype(pool.FindMessageTypeByName("tandem.v1.GenerateResponse"))
        method = pool.FindServiceByName("tandem.v1.Generation").FindMethodByName("Generate")
        assert method.output_type.full_name == "tandem.v1.GenerateResponse"

        # 3. A Generate stream with dynamically built messages.
        n = 24
        request = req_cls()
        request.prompt_token_ids.extend(reference["prompt_token_ids"])
        request.sampling.max_tokens = n
        generate = channel.unary_stream("/tandem.v1.Generation/Generate",
                                        request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=resp_cls.FromString)
        tokens, last = [], None
        for msg in generate(request, timeout=30):
            tokens.extend(msg.token_ids)
            last = msg
        print("tokens:", tokens)
        expected = reference["expected_output_token_ids"][:n]
        assert tokens == expected, f"got {tokens}, want {expected}"
        assert last.usage.output_tokens == n and last.usage.prompt_tokens == len(request.prompt_token_ids)

        # A bad request from this client gets INVALID_ARGUMENT with a message.
        bad = req_cls()
        bad.sampling.max_tokens = 4
        try:
            list(generate(bad, timeout=10))
            raise AssertionError("empty prompt was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            print("empty prompt:", e.code(), e.details())
        # The worker: health, reflection, and Describe with reflected types.
        wchannel = grpc.insecure_channel(f"127.0.0.1:{wport}")
        assert wait_serving(health_pb2, health_pb2_grpc, wchannel), "worker never SERVING"
        check_health(health_pb2, health_pb2_grpc, wchannel, "tandem.v1.Worker")
        wservices, wpool = reflect(reflection_pb2, reflection_pb2_grpc, wchannel, "tandem.v1.Worker")
        print("worker services:", wservices)
        for want in ("tandem.v1.Worker", "grpc.health.v1.Health"):
            assert want in wservices, f"{want} not listed by the worker's reflection: {wservices}"
        assert "tandem.v1.Generation" not in wservices, wservices
        wfactory = message_factory.MessageFactory(wpool)
        dreq = wfactory.GetPrototype(wpool.FindMessageTypeByName("tandem.v1.DescribeRequest"))
        dresp = wfactory.GetPrototype(wpool.FindMessageTypeByName("tandem.v1.DescribeResponse"))
        describe = wchannel.unary_unary("/tandem.v1.Worker/Describe",
                                        request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=dresp.FromString)
        d = describe(dreq(), timeout=10)
        assert d.vocab_size == 512 and d.block_size == 16 and d.num_kv_blocks > 0, d
        print("worker describe:", d.model_name, d.backend, d.num_kv_blocks, "blocks")
        # The health service's own descriptors are reflected too.
        _, hpool = reflect(reflection_pb2, reflection_pb2_grpc, wchannel, "grpc.health.v1.Health")
        assert hpool.FindServiceByName("grpc.health.v1.Health").FindMethodByName("Watch")

        # 4. Prometheus text on /metrics counts the finished request.
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        finished = [l for l in text.splitlines()
                    if l.startswith('tandem_scheduler_requests_finished_total{')
                    and 'reason="length"' in l and 'model_name="' in l]
        assert finished and float(finished[0].split()[-1]) >= 1, text
        assert "# TYPE tandem_scheduler_time_to_first_token_seconds histogram" in text
        print("metrics:", finished[0])
        print("PASS")
        return 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
