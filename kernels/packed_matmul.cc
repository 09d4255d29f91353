// The fast CPU matmul. Each output element is still one sequential sum over
// the input dimension (so results equal the plain Matmul bit for bit); the
// speed comes from computing kPanelRows rows x kTokenTile tokens at once in
// vector lanes, each lane its own sequential sum, with the weight panel
// reused by every token of the step. No FMA: the file is built with
// -ffp-contract=off so multiply and add round separately, as in run.c.
#include <algorithm>
#include <cstring>

#include "cpu_simd.h"
#include "tandem/kernels/cpu_ops.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int32_t kLanes = PackedMatrix::kPanelRows;
constexpr int32_t kTokenTile = 4;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

TANDEM_CPU_CLONES
void ApplyPanels(const float* panels, int32_t out_dim, int32_t in_dim, const float* x, int32_t rows,
                 float* y) {
  const int32_t num_panels = (out_dim + kLanes - 1) / kLanes;
  for (int32_t p = 0; p < num_panels; ++p) {
    const float* panel = panels + int64_t{p} * in_dim * kLanes;
    const int32_t row0 = p * kLanes;
    const int32_t lanes = std::min(kLanes, out_dim - row0);
    int32_t r = 0;
    for (; r + kTokenTile <= rows; r += kTokenTile) {
      const float* x0 = x + int64_t{r} * in_dim;
      const float* x1 = x0 + in_dim;
      const float* x2 = x1 + in_dim;
      const float* x3 = x2 + in_dim;
      Vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int32_t j = 0; j < in_dim; ++j) {
        Vec w;
        std::memcpy(&w, panel + int64_t{j} * kLanes, sizeof(Vec));
        a0 = a0 + w * x0[j];
        a1 = a1 + w * x1[j];
        a2 = a2 + w * x2[j];
        a3 = a3 + w * x3[j];
      }
      for (int32_t l = 0; l < lanes; ++l) {
        y[int64_t{r} * out_dim + row0 + l] = a0[l];
        y[int64_t{r + 1} * out_dim + row0 + l] = a1[l];
        y[int64_t{r + 2} * out_dim + row0 + l] = a2[l];
        y[int64_t{r + 3} * out_dim + row0 + l] = a3[l];
      }
    }
    for (; r < rows; ++r) {
      const float* x0 = x + int64_t{r} * in_dim;
      Vec a0 = {};
      for (int32_t j = 0; j < in_dim; ++j) {
        Vec w;
        std::memcpy(&w, panel + int64_t{j} * kLanes, sizeof(Vec));
        a0 = a0 + w * x0[j];
      }
      for (int32_t l = 0; l < lanes; ++l) y[int64_t{r} * out_dim + row0 + l] = a0[l];
    }
  }
}

}  // namespace

PackedMatrix::PackedMatrix(const float* w, int32_t out_dim, int32_t in_dim)
    : out_dim_(out_dim), in_dim_(in_dim) {
  const int32_t num_panels = (out_dim + kLanes - 1) / kLanes;
  panels_.assign(static_cast<size_t>(num_panels) * in_dim * kLanes, 0.0f);
  for (int32_t i = 0; i < out_dim; ++i) {
    const int32_t p = i / kLanes;
    const int32_t l = i % kLanes;
    for (int32_t j = 0; j < in_dim; ++j) {
      panels_[(static_cast<size_t>(p) * in_dim + j) * kLanes + l] =
          w[static_cast<int64_t>(i) * in_dim + j];
    }
  }
}

void PackedMatrix::Apply(const float* x, int32_t rows, float* y) const {
  ApplyPanels(panels_.data(), out_dim_, in_dim_, x, rows, y);
}

void PackedMatrix::ApplyRows(const float* x, int32_t row_begin, int32_t row_end, float* y) const {
  ApplyPanels(panels_.data(), out_dim_, in_dim_, x + int64_t{row_begin} * in_dim_,
              row_end - row_begin, y + int64_t{row_begin} * out_dim_);
}

}  // namespace tandem::kernels::cpu
