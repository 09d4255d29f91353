// llama2.c checkpoints from arbitrary bytes (an untrusted --model file): an
// error or a model, never a crash or an allocation the file cannot back.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/model/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("ckpt", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size > 0 && write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  auto ckpt = tandem::model::ReadLlama2cCheckpoint("/proc/self/fd/" + std::to_string(fd));
  (void)ckpt;
  close(fd);
  return 0;
}
