// Private: GCC vector types and per-ISA clones for the CPU kernels. Lanes are
// independent sums, so the results do not depend on the ISA picked at run
// time (no FMA: multiply and add round separately, -ffp-contract=off).
#pragma once

// Not in sanitizer builds: ThreadSanitizer crashes in the IFUNC resolvers,
// which run before its runtime is initialised.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(TANDEM_SANITIZER_BUILD)
#define TANDEM_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TANDEM_CPU_CLONES
#endif
