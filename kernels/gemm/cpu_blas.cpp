#include "kernels/gemm/cpu_blas.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#ifdef ZGPT_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace zgpt::cpu {

namespace {

// Set on the re-exec: the core the library had chosen by itself (so the second start knows it
// was us, not the user, who set OPENBLAS_CORETYPE, and never re-executes again).
constexpr const char* kReexecVar = "ZGPT_BLAS_LIBRARY_CHOICE";

std::string cpu_model_name() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("model name", 0) != 0) continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) break;
        const size_t start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
    }
    return "";
}

std::string openblas_core_now() {
#ifdef ZGPT_HAVE_OPENBLAS
    const char* name = openblas_get_corename();
    return name ? name : "";
#else
    return "";
#endif
}

}  // namespace

const char* isa_name(VectorIsa isa) {
    switch (isa) {
        case VectorIsa::scalar:
            return "scalar";
        case VectorIsa::sse3:
            return "sse3";
        case VectorIsa::avx:
            return "avx";
        case VectorIsa::avx2:
            return "avx2";
        case VectorIsa::avx512:
            return "avx512";
    }
    return "?";
}

VectorIsa cpu_vector_isa() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return VectorIsa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorIsa::avx2;
    if (__builtin_cpu_supports("avx")) return VectorIsa::avx;
    if (__builtin_cpu_supports("sse3")) return VectorIsa::sse3;
#endif
    return VectorIsa::scalar;
}

VectorIsa openblas_core_isa(const std::string& core) {
    // OpenBLAS's x86-64 DYNAMIC_ARCH cores (driver/others/dynamic.c), by the widest vectors their
    // sgemm kernels use.
    static const struct {
        const char* name;
        VectorIsa isa;
    } cores[] = {
        {"SkylakeX", VectorIsa::avx512},
        {"Cooperlake", VectorIsa::avx512},
        {"SapphireRapids", VectorIsa::avx512},
        {"Haswell", VectorIsa::avx2},
        {"Zen", VectorIsa::avx2},
        {"Sandybridge", VectorIsa::avx},
        {"Bulldozer", VectorIsa::avx},
        {"Piledriver", VectorIsa::avx},
        {"Steamroller", VectorIsa::avx},
        {"Excavator", VectorIsa::avx},
        {"Prescott", VectorIsa::sse3},
        {"Core2", VectorIsa::sse3},
        {"Penryn", VectorIsa::sse3},
        {"Dunnington", VectorIsa::sse3},
        {"Nehalem", VectorIsa::sse3},
        {"Atom", VectorIsa::sse3},
        {"Nano", VectorIsa::sse3},
        {"Opteron_SSE3", VectorIsa::sse3},
        {"Barcelona", VectorIsa::sse3},
        {"Bobcat", VectorIsa::sse3},
    };
    for (const auto& c : cores)
        if (core.size() == std::string(c.name).size() &&
            std::equal(core.begin(), core.end(), c.name,
                       [](char a, char b) { return std::tolower(a) == std::tolower(b); }))
            return c.isa;
    return VectorIsa::scalar;
}

std::string openblas_core_to_request(VectorIsa cpu, const std::string& chosen) {
    if (openblas_core_isa(chosen) >= cpu) return "";
    switch (cpu) {
        case VectorIsa::avx512:
            return "SkylakeX";
        case VectorIsa::avx2:
            return "Haswell";
        case VectorIsa::avx:
            return "Sandybridge";
        case VectorIsa::sse3:
            return "Prescott";
        case VectorIsa::scalar:
            return "";
    }
    return "";
}

BlasInfo blas_info() {
    BlasInfo b;
#ifdef ZGPT_HAVE_OPENBLAS
    const char* config = openblas_get_config();
    b.library = config ? config : "OpenBLAS";
    b.kernel = openblas_core_now();
    b.kernel_isa = openblas_core_isa(b.kernel);
    const char* picked = std::getenv(kReexecVar);
    if (picked && *picked) {
        b.chosen_by = "zgpt";
        b.library_choice = picked;
    } else if (const char* env = std::getenv("OPENBLAS_CORETYPE"); env && *env) {
        b.chosen_by = "environment";
    } else {
        b.chosen_by = "library";
        b.library_choice = b.kernel;
    }
#else
    b.library = "none (plain loops)";
    b.kernel = "plain loops";
    b.kernel_isa = VectorIsa::scalar;  // the compiler's vectorisation, not a BLAS kernel
    b.chosen_by = "build";
#endif
    return b;
}

void ensure_blas_kernel(char** argv) {
#ifdef ZGPT_HAVE_OPENBLAS
    if (const char* picked = std::getenv(kReexecVar); picked && *picked) return;  // second start
    if (const char* env = std::getenv("OPENBLAS_CORETYPE"); env && *env) return;  // the user's
    const std::string chosen = openblas_core_now();
    const std::string want = openblas_core_to_request(cpu_vector_isa(), chosen);
    if (want.empty()) return;
    setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
    setenv(kReexecVar, chosen.c_str(), 1);
    std::fflush(nullptr);
    execv("/proc/self/exe", argv);
    // No re-exec (no /proc): go on with the library's kernel and say so.
    std::fprintf(stderr,
                 "warning: OpenBLAS chose the %s kernel on an %s CPU; could not restart "
                 "with OPENBLAS_CORETYPE=%s\n",
                 chosen.c_str(), isa_name(cpu_vector_isa()), want.c_str());
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(kReexecVar);
#else
    (void)argv;
#endif
}

std::string cpu_blas_summary() {
    const BlasInfo b = blas_info();
    const VectorIsa cpu = cpu_vector_isa();
    std::string s = "CPU: " + cpu_model_name() + ", ISA " + isa_name(cpu) + "; BLAS: " + b.library +
                    ", kernel " + b.kernel;
    if (b.chosen_by == "zgpt")
        s += " (the library chose " + b.library_choice + ", below the CPU; set by zgpt)";
    else if (b.chosen_by == "environment")
        s += " (OPENBLAS_CORETYPE from the environment)";
    else if (b.chosen_by == "library")
        s += " (the library's own choice)";
    if (b.chosen_by != "build" && b.kernel_isa < cpu)
        s += std::string("; warning: this kernel uses ") + isa_name(b.kernel_isa) +
             ", below the CPU's " + isa_name(cpu);
    return s;
}

}  // namespace zgpt::cpu
