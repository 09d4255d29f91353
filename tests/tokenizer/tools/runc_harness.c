// Runs llama2.c's own encode() over texts, to record references for
// tokenizer.bin (see runc_references.py; run.c itself is not in this repo).
// Compiled as: cc -DTESTING -DRUN_C='"/path/to/run.c"' runc_harness.c -lm
// Input on stdin: records of a little-endian uint32 length and that many bytes.
// Output: one line of space-separated ids per record (BOS first, as run.c's
// generate() asks for: encode(text, bos=1, eos=0)).
#include RUN_C

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s tokenizer.bin vocab_size < records\n", argv[0]);
    return 2;
  }
  Tokenizer tokenizer;
  build_tokenizer(&tokenizer, argv[1], atoi(argv[2]));
  unsigned char len_bytes[4];
  while (fread(len_bytes, 1, 4, stdin) == 4) {
    size_t len = len_bytes[0] | len_bytes[1] << 8 | len_bytes[2] << 16 | (size_t)len_bytes[3] << 24;
    char* text = malloc(len + 1);
    if (fread(text, 1, len, stdin) != len) return 1;
    text[len] = '\0';
    int* tokens = malloc((len + 3) * sizeof(int));
    int n_tokens = 0;
    encode(&tokenizer, text, 1, 0, tokens, &n_tokens);
    for (int i = 0; i < n_tokens; i++) printf(i ? " %d" : "%d", tokens[i]);
    printf("\n");
    free(tokens);
    free(text);
  }
  free_tokenizer(&tokenizer);
  return 0;
}
