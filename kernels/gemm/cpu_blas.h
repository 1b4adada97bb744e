// The CPU's vector instruction set and the BLAS kernel that runs the float matmuls. A
// distribution's OpenBLAS may not know a newer CPU and fall back to an old core (Debian's 0.3.21
// picks the SSE3 "Prescott" kernel on some AVX-512 Xeons: 2x slower matmuls). OpenBLAS reads
// OPENBLAS_CORETYPE only when it loads, so the fix is a re-exec with the variable set, early in
// main (docs/results/cpu_vs_nanogpt.json has the measurements behind the choice of core).
#pragma once
#include <string>

namespace zgpt::cpu {

// Vector ISA levels in order; each includes the ones before it.
enum class VectorIsa { scalar, sse3, avx, avx2, avx512 };

const char* isa_name(VectorIsa isa);

// This machine's level (cpuid and the OS's register-state support, through
// __builtin_cpu_supports): avx512 needs F, CD, BW, DQ and VL; avx2 needs FMA too.
VectorIsa cpu_vector_isa();

// The ISA an OpenBLAS x86-64 core name's kernels use ("Prescott" -> sse3, "Haswell" -> avx2,
// "SkylakeX" -> avx512); scalar for a name it does not know.
VectorIsa openblas_core_isa(const std::string& core);

// The OpenBLAS core to ask for on a CPU of level `cpu` when the library chose `chosen`; empty
// when `chosen` is already at the CPU's level (or the level has no x86 core to ask for).
std::string openblas_core_to_request(VectorIsa cpu, const std::string& chosen);

struct BlasInfo {
    std::string library;  // "OpenBLAS 0.3.21 ..." or "none (plain loops)"
    std::string kernel;   // the core in use, e.g. "SkylakeX"; "plain loops" without a BLAS
    VectorIsa kernel_isa = VectorIsa::scalar;
    // Who chose the kernel: "library" (its own detection), "zgpt" (re-executed with
    // OPENBLAS_CORETYPE because the library's choice, `library_choice`, was below the CPU),
    // "environment" (OPENBLAS_CORETYPE set by the user, honoured as given) or "build" (no BLAS).
    std::string chosen_by;
    std::string library_choice;
};

BlasInfo blas_info();

// Call first thing in main. When the BLAS runs a kernel below the CPU's ISA and the user did not
// set OPENBLAS_CORETYPE, sets it and re-executes the program (/proc/self/exe, same argv); the
// second start keeps whatever it gets. Returns normally when there is nothing to do.
void ensure_blas_kernel(char** argv);

// One line for logs: "CPU: AMD EPYC, ISA avx512; BLAS: OpenBLAS ..., kernel SkylakeX (...)".
std::string cpu_blas_summary();

}  // namespace zgpt::cpu
