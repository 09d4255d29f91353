// Device memory and the skip-without-a-device fixture of the CUDA kernel tests.
#pragma once

#if defined(TANDEM_HAVE_CUDA) && TANDEM_HAVE_CUDA

#include <vector>

#include "gtest/gtest.h"
#include "tandem/kernels/cuda_ops.h"

namespace tandem::kernels::testing {

#define CUDA_OK(expr)                                           \
  do {                                                          \
    const int _e = (expr);                                      \
    ASSERT_EQ(_e, 0) << #expr << ": " << ::tandem::kernels::cuda::ErrorString(_e); \
  } while (0)

// A device copy of a host vector.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(::tandem::kernels::cuda::Malloc(reinterpret_cast<void**>(&ptr_), Bytes() + 1), 0);
    if (!host.empty()) {
      EXPECT_EQ(::tandem::kernels::cuda::CopyToDevice(ptr_, host.data(), Bytes()), 0);
    }
  }
  explicit DeviceVector(size_t n) : DeviceVector(std::vector<T>(n)) {}
  ~DeviceVector() { ::tandem::kernels::cuda::Free(ptr_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() { return ptr_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    EXPECT_EQ(::tandem::kernels::cuda::CopyToHost(host.data(), ptr_, Bytes()), 0);
    return host;
  }

 private:
  size_t Bytes() const { return size_ * sizeof(T); }
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::tandem::kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace tandem::kernels::testing

#endif  // TANDEM_HAVE_CUDA
