// `tandem serve MODEL [flags]`: one command like `vllm serve MODEL` (issue
// 33). It starts, on this machine, tandem-worker (MODEL), tandem-scheduler
// and tandem-frontend (the OpenAI API on --host:--port), and tandem-kvstore
// with --kv-store, each on loopback ports it picks, waits until the API
// answers /health, and on SIGINT or SIGTERM stops them front to back (each
// drains) and exits 0. A part that exits on its own stops the rest and
// `tandem serve` exits 1. The children die with it (PR_SET_PDEATHSIG).
//
// Flags take vLLM's names where both have one and go to the part that owns
// them: --host, --port, --served-model-name NAME [NAME ...] (each served by
// the frontend, the first names the scheduler's metrics), --max-model-len
// (the scheduler and the worker: a longrope model serves past its original
// context with its long factors then, as in vLLM), --max-num-seqs, --max-num-batched-tokens,
// --max-logprobs,
// --[no-]enable-prefix-caching,
// --[no-]enable-chunked-prefill, --block-size, --dtype, --api-key,
// --chat-template, --tokenizer, --disable-log-requests, --generation-config
// auto (the model's generation_config.json: what the worker always reads),
// --gpu-memory-utilization (the worker's KV cache on cuda).
// Refused by name, with the reason, until built: --seed, --generation-config
// other than auto. Any other
// flag goes to every part whose --help lists it (--backend, --threads to the
// worker; --log-level style flags to each), and a flag no part lists is an
// error (exit 2), as is a second positional argument. The binaries are
// looked up beside `tandem` (an install), in the build tree's layout, or in
// $TANDEM_BIN_DIR.
#pragma once

namespace tandem::cli {

// argv[1] is "serve". Returns the exit code.
int Serve(int argc, char** argv);

}  // namespace tandem::cli
