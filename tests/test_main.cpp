#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "kernels/gemm/cpu_blas.h"
#include "tests/helpers.h"

#include <cstring>

// `--why-skip` prints whether this binary would skip and why, then exits (tools/test.sh shows it,
// since ctest's summary says only "Skipped").
int main(int argc, char** argv) {
    zgpt::cpu::ensure_blas_kernel(argv);  // the float matmuls on the CPU's own kernel
    if (argc > 1 && std::strcmp(argv[1], "--why-skip") == 0) {
        const std::string reason = zgpt::test::skip_reason();
        if (!reason.empty()) std::printf("%s: SKIPPED: %s\n", argv[0], reason.c_str());
        return 0;
    }
    if (const std::string reason = zgpt::test::skip_reason(); !reason.empty()) {
        std::printf("SKIPPED: %s\n", reason.c_str());
        return 77;  // ctest: SKIP_RETURN_CODE
    }
    doctest::Context ctx;
    ctx.applyCommandLine(argc, argv);
    return ctx.run();
}
