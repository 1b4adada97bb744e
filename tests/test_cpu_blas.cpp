// The CPU backend's float matmuls run a BLAS kernel of the machine's vector ISA, never an older
// core that the library fell back to (Debian's OpenBLAS 0.3.21 picks the SSE3 "Prescott" kernel on
// some AVX-512 Xeons). tests/test_main.cpp calls ensure_blas_kernel first, as train does.
#include <doctest/doctest.h>

#include <cstdlib>
#include <vector>

#include "kernels/gemm/cpu_blas.h"
#include "kernels/gemm/matmul.h"

using namespace zgpt::cpu;

TEST_CASE("cpu_blas: OpenBLAS core names map to their ISA, and a lower one asks for the CPU's") {
    CHECK(openblas_core_isa("Prescott") == VectorIsa::sse3);
    CHECK(openblas_core_isa("Sandybridge") == VectorIsa::avx);
    CHECK(openblas_core_isa("Haswell") == VectorIsa::avx2);
    CHECK(openblas_core_isa("Zen") == VectorIsa::avx2);
    CHECK(openblas_core_isa("SkylakeX") == VectorIsa::avx512);
    CHECK(openblas_core_isa("COOPERLAKE") == VectorIsa::avx512);
    CHECK(openblas_core_isa("Unknown") == VectorIsa::scalar);
    CHECK(openblas_core_to_request(VectorIsa::avx512, "Prescott") == "SkylakeX");
    CHECK(openblas_core_to_request(VectorIsa::avx512, "Haswell") == "SkylakeX");
    CHECK(openblas_core_to_request(VectorIsa::avx512, "Cooperlake").empty());
    CHECK(openblas_core_to_request(VectorIsa::avx2, "Prescott") == "Haswell");
    CHECK(openblas_core_to_request(VectorIsa::avx2, "Zen").empty());
    CHECK(openblas_core_to_request(VectorIsa::avx2, "SkylakeX").empty());
    CHECK(openblas_core_to_request(VectorIsa::avx, "Nehalem") == "Sandybridge");
}

TEST_CASE("cpu_blas: the float matmul's kernel is not below the CPU's ISA") {
    const BlasInfo b = blas_info();
    const VectorIsa cpu = cpu_vector_isa();
    MESSAGE(cpu_blas_summary());
    // The matmul runs through the library whose kernel is checked below.
    std::vector<float> x(6 * 5, 1.0f), w(3 * 5, 2.0f), y(6 * 3, -1.0f);
    matmul_forward(y.data(), x.data(), w.data(), static_cast<const float*>(nullptr), 6, 5, 3);
    for (float v : y) REQUIRE(v == 10.0f);
    if (b.chosen_by == "build") {
        MESSAGE("built without OpenBLAS: the plain loops, vectorised by the compiler");
        return;
    }
    if (b.chosen_by == "environment") {  // the user's OPENBLAS_CORETYPE is honoured as given
        const char* env = std::getenv("OPENBLAS_CORETYPE");
        REQUIRE(env != nullptr);
        CHECK(openblas_core_isa(b.kernel) == openblas_core_isa(env));
        return;
    }
    INFO("CPU ISA ", isa_name(cpu), ", kernel ", b.kernel, " (", isa_name(b.kernel_isa),
         "), chosen by ", b.chosen_by, ", the library had chosen ", b.library_choice);
    CHECK(b.kernel_isa >= cpu);
}
