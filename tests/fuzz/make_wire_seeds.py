#!/usr/bin/python3
"""Writes the seed corpora of the wire fuzzers (load_wire, bulk_frame,
step_convert) into tests/fuzz/corpus/: valid messages of each kind, in the
layout each fuzzer reads (see its header). Run from the repository root with
Debian's python3 (grpc_tools): /usr/bin/python3 tests/fuzz/make_wire_seeds.py
"""
import os
import struct
import sys
import tempfile

from grpc_tools import protoc

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tmp = tempfile.mkdtemp()
assert protoc.main(["protoc", f"-I{root}/protos", f"--python_out={tmp}"] +
                   [f"{root}/protos/tandem/v1/{p}.proto" for p in ("common", "worker", "kvstore")]) == 0
sys.path.insert(0, tmp)
from tandem.v1 import common_pb2 as c, kvstore_pb2 as kv, worker_pb2 as w  # noqa: E402


def write(target, name, data):
    d = os.path.join(root, "tests/fuzz/corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


H1, H2 = b"\x11" * 32, b"\x22" * 32

# step_convert: byte 0 odd = SchedulerOutput, even = ModelRunnerOutput.
step = w.SchedulerOutput(
    step_id=3, last_processed_step_id=2,
    scheduled_new_reqs=[w.NewRequestData(request_id="a", prompt_token_ids=[1, 2, 3], block_ids=[0],
                                         sampling=c.SamplingParams(max_tokens=4, top_k=5, seed=9,
                                                                   has_seed=True))],
    scheduled_cached_reqs=[w.CachedRequestData(request_id="b", new_block_ids=[4],
                                               num_computed_tokens=16, num_output_placeholders=1)],
    num_scheduled_tokens=[3, 1], total_num_scheduled_tokens=4, finished_req_ids=["z"],
    preempted_req_ids=["y"],
    kv_connector_metadata=w.KvConnectorMetadata(
        loads=[w.KvLoad(request_id="a", block_hashes=[H1], block_ids=[0])],
        stores=[w.KvStoreOp(request_id="b", block_ids=[4], block_hashes=[H2],
                            before_forward=True)]))
write("step_convert", "scheduler_output", b"\x01" + step.SerializeToString())
resumed = w.SchedulerOutput(step_id=7, scheduled_cached_reqs=[w.CachedRequestData(
    request_id="r", resumed_from_preemption=True, new_block_ids=[1, 2], all_token_ids=[1, 5, 6],
    num_computed_tokens=0)], num_scheduled_tokens=[3], total_num_scheduled_tokens=3)
write("step_convert", "resumed", b"\x01" + resumed.SerializeToString())
out = w.ModelRunnerOutput(
    step_id=3, sampled=[w.SampledTokens(request_id="a", token_ids=[7]),
                        w.SampledTokens(request_id="b")],
    kv_connector_report=w.KvConnectorReport(finished_recving=["a"], finished_sending=["b"],
                                            invalid_block_ids=[0], num_load_failed_checksum=1,
                                            failed_sending=["b"]))
write("step_convert", "model_runner_output", b"\x00" + out.SerializeToString())

# load_wire: byte 0 = slice length - 1, then a LoadResponse.
resp = kv.LoadResponse(chunks=[
    kv.LoadChunk(block_index=0, offset=0, data=b"abcdefgh", last=False, ok=True, total_size=12),
    kv.LoadChunk(block_index=0, offset=8, data=b"ijkl", last=True, ok=True, total_size=12,
                 checksum=0x1234),
    kv.LoadChunk(block_index=1, last=True, ok=False, miss_reason=1)])
write("load_wire", "two_blocks_whole", b"\xff" + resp.SerializeToString())
write("load_wire", "two_blocks_sliced", b"\x04" + resp.SerializeToString())


def frame(msg):
    b = msg.SerializeToString()
    return struct.pack("<I", len(b)) + b


# bulk_frame: byte 0 % 3 = 0 server, 1 load client, 2 lookup client.
write("bulk_frame", "server", b"\x00" + b"TKVBULK1" +
      frame(kv.LoadRequest(namespace="ns", block_hashes=[H1, H2], lease_id=5)) +
      frame(kv.LoadRequest(namespace="ns", corrupt_block_hashes=[H1])))
write("bulk_frame", "load_client", b"\x01" +
      frame(kv.BulkLoadFrame(chunk=kv.LoadChunk(block_index=0, ok=True, last=True, total_size=16,
                                                checksum=7))) + bytes(range(16)) +
      frame(kv.BulkLoadFrame(chunk=kv.LoadChunk(block_index=1, ok=False, last=True,
                                                miss_reason=1))) +
      frame(kv.BulkLoadFrame(done=True)))
write("bulk_frame", "lookup_client", b"\x02" +
      frame(kv.BulkLookupAnswer(response=kv.LookupResponse(num_hits=2, lease_id=9))) +
      frame(kv.BulkLookupAnswer(status_code=5, status_message="no namespace")))
print("seeds written")
