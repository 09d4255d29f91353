// Opens libtandem_sentencepiece.so (see sentencepiece_shim.h for why).
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "sentencepiece_shim.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TANDEM_NO_DEEPBIND 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TANDEM_NO_DEEPBIND 1
#endif
#endif

namespace tandem::tokenizer::internal {
namespace {

constexpr char kModuleName[] = "libtandem_sentencepiece.so";

std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1);
}

// The module's entry point, or nullptr with `error` naming every place tried.
SentencePieceLoadFn OpenModule(std::string* error) {
  static std::once_flag once;
  static SentencePieceLoadFn load = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("TANDEM_SENTENCEPIECE_MODULE"); env != nullptr && *env) {
      candidates.push_back(env);
    }
    candidates.push_back(ExecutableDir() + kModuleName);
#ifdef TANDEM_SENTENCEPIECE_MODULE_PATH
    candidates.push_back(TANDEM_SENTENCEPIECE_MODULE_PATH);
#endif
    candidates.push_back(kModuleName);  // the dynamic loader's search path
    int flags = RTLD_NOW | RTLD_LOCAL;
#ifndef TANDEM_NO_DEEPBIND
    flags |= RTLD_DEEPBIND;
#endif
    for (const std::string& path : candidates) {
      void* handle = dlopen(path.c_str(), flags);
      if (handle == nullptr) {
        failure += "\n  " + path + ": " + dlerror();
        continue;
      }
      load = reinterpret_cast<SentencePieceLoadFn>(dlsym(handle, kSentencePieceLoadSymbol));
      if (load != nullptr) return;
      failure += "\n  " + path + ": no symbol " + kSentencePieceLoadSymbol;
      dlclose(handle);
    }
  });
  if (load == nullptr) {
    *error = std::string("cannot open ") + kModuleName + " (SentencePiece support):" + failure;
  }
  return load;
}

}  // namespace

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  SentencePieceLoadFn load = OpenModule(error);
  if (load == nullptr) return nullptr;
  return std::unique_ptr<SentencePieceModel>(load(path, error));
}

}  // namespace tandem::tokenizer::internal
