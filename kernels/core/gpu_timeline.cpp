// GpuTimeline (kernels/core/gpu_timeline.h): CUPTI's activity records, opened at run time.
#include "kernels/core/gpu_timeline.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti_activity.h>
#include <cupti_version.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

namespace zgpt {
namespace {

// CUPTI asks for buffers and hands them back full through C callbacks, from its own threads as
// well, and at process exit: they are collected here, one list per process, never destroyed (a
// callback from CUPTI's exit handler must not find it gone).
struct Buffers {
    std::mutex mu;
    std::vector<std::pair<uint8_t*, size_t>> done;  // full buffers and their valid bytes
};
Buffers& buffers() {
    static Buffers* b = new Buffers;
    return *b;
}
constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = kBufferBytes;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lk(buffers().mu);
    buffers().done.emplace_back(buffer, valid);
}

std::vector<std::pair<uint8_t*, size_t>> take_buffers() {
    std::lock_guard<std::mutex> lk(buffers().mu);
    return std::exchange(buffers().done, {});
}

const char* copy_name(uint8_t kind) {
    switch (kind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
            return "memcpy host to device";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
            return "memcpy device to host";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
            return "memcpy device to device";
        default:
            return "memcpy (other)";
    }
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                     CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
                                     CUPTI_ACTIVITY_KIND_RUNTIME};

// "cudaMemcpyAsync_v3020" -> "cudaMemcpyAsync"
std::string api_name(const char* n) {
    std::string s = n != nullptr ? n : "cuda?";
    const size_t v = s.rfind("_v");
    if (v != std::string::npos && v + 2 < s.size() &&
        s.find_first_not_of("0123456789", v + 2) == std::string::npos)
        s.erase(v);
    return s;
}

}  // namespace

struct GpuTimeline::Cupti {
    void* lib = nullptr;
    decltype(&cuptiActivityEnable) enable = nullptr;
    decltype(&cuptiActivityDisable) disable = nullptr;
    decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
    decltype(&cuptiActivityFlushAll) flush_all = nullptr;
    decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
    decltype(&cuptiActivityGetNumDroppedRecords) dropped = nullptr;
    decltype(&cuptiGetVersion) version = nullptr;
    decltype(&cuptiGetTimestamp) timestamp = nullptr;
    decltype(&cuptiGetCallbackName) callback_name = nullptr;
    // lib stays loaded: CUPTI has hooked the driver, which calls into it until the process ends
    // (closing it made bench_train crash at exit)
};

GpuTimeline::GpuTimeline() : cupti_(std::make_unique<Cupti>()) {
    // the toolkit's CUPTI sits beside the runtime or in extras/CUPTI, often off the loader's path
    const char* home = std::getenv("CUDA_HOME");
    const std::string root = home != nullptr ? home : "/usr/local/cuda";
    for (const std::string& p :
         {std::string("libcupti.so.13"), std::string("libcupti.so"), root + "/lib64/libcupti.so",
          root + "/extras/CUPTI/lib64/libcupti.so", root + "/targets/x86_64-linux/lib/libcupti.so"})
        if ((cupti_->lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (cupti_->lib == nullptr) {
        why_ = "libcupti (the CUDA toolkit's CUPTI) not found; set CUDA_HOME";
        return;
    }
    auto sym = [&](auto& f, const char* name) {
        f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(cupti_->lib, name));
        if (f == nullptr && why_.empty()) why_ = std::string("libcupti lacks ") + name;
    };
    sym(cupti_->enable, "cuptiActivityEnable");
    sym(cupti_->disable, "cuptiActivityDisable");
    sym(cupti_->register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(cupti_->flush_all, "cuptiActivityFlushAll");
    sym(cupti_->next_record, "cuptiActivityGetNextRecord");
    sym(cupti_->dropped, "cuptiActivityGetNumDroppedRecords");
    sym(cupti_->version, "cuptiGetVersion");
    sym(cupti_->timestamp, "cuptiGetTimestamp");
    sym(cupti_->callback_name, "cuptiGetCallbackName");
    if (!why_.empty()) return;
    uint32_t v = 0;
    cupti_->version(&v);
    // the records are read with this build's struct layouts: the same major version only
    if (v / 10000 != CUPTI_API_VERSION / 10000) {
        why_ = "libcupti API version " + std::to_string(v) + ", this build reads " +
               std::to_string(CUPTI_API_VERSION) + "'s records";
        return;
    }
    if (cupti_->register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
        why_ = "cuptiActivityRegisterCallbacks failed";
}

GpuTimeline::~GpuTimeline() {
    if (on_) {
        for (CUpti_ActivityKind k : kKinds) cupti_->disable(k);
        cupti_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    }
    for (auto& [b, n] : take_buffers()) std::free(b);
}

void GpuTimeline::start() {
    if (!why_.empty()) return;
    cupti_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // drop what came before
    for (auto& [b, n] : take_buffers()) std::free(b);
    marks_.clear();
    for (CUpti_ActivityKind k : kKinds)
        if (cupti_->enable(k) != CUPTI_SUCCESS) {
            why_ = "cuptiActivityEnable failed (another profiler attached?)";
            for (CUpti_ActivityKind d : kKinds) cupti_->disable(d);  // those it did turn on
            return;
        }
    on_ = true;
    // CUPTI sets itself up at the first calls after it starts (milliseconds, when that was inside
    // a recorded step): a synchronised probe takes that before anything is recorded
    void* probe = nullptr;
    if (cudaMalloc(&probe, 256) == cudaSuccess) {
        cudaMemsetAsync(probe, 0, 256);
        cudaDeviceSynchronize();
        cudaFree(probe);
    }
}

void GpuTimeline::mark() {
    uint64_t t = 0;
    if (on_ && cupti_->timestamp(&t) == CUPTI_SUCCESS) marks_.push_back(t);
}

std::vector<TimelineSummary> GpuTimeline::stop(int gaps, int top) {
    if (!on_) return {};
    for (CUpti_ActivityKind k : kKinds) cupti_->disable(k);
    on_ = false;
    cupti_->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    enum Kind { gpu_kernel, gpu_copy, gpu_memset, host_call };
    struct Rec {
        TimelineInterval iv;
        Kind kind;
    };
    std::vector<Rec> recs;
    std::vector<std::string> names;
    std::map<std::string, int> label_of;  // names copied: CUPTI's strings are its own
    // (a record CUPTI could not time has a zero or reversed interval: left out)
    auto keep = [&](uint64_t start, uint64_t end, int lab, Kind kind) {
        if (start != 0 && end >= start) recs.push_back({{start, end, lab}, kind});
    };
    auto label = [&](const std::string& n) {
        auto [it, fresh] = label_of.emplace(n, int(names.size()));
        if (fresh) names.push_back(n);
        return it->second;
    };
    for (auto& [buf, valid] : take_buffers()) {
        CUpti_Activity* r = nullptr;
        while (cupti_->next_record(buf, valid, &r) == CUPTI_SUCCESS) {
            if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
                const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
                keep(k->start, k->end, label(short_kernel_name(k->name)), gpu_kernel);
            } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
                const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
                keep(c->start, c->end, label(copy_name(c->copyKind)), gpu_copy);
            } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
                keep(m->start, m->end, label("memset"), gpu_memset);
            } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
                const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(r);
                const char* n = nullptr;
                cupti_->callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &n);
                keep(a->start, a->end, label(api_name(n)), host_call);
            }
        }
        std::free(buf);
    }
    size_t dropped = 0;
    if (cupti_->dropped(nullptr, 0, &dropped) != CUPTI_SUCCESS) dropped = 0;
    // windows: [mark k, mark k + 1), the last one open; without marks, one window of everything
    std::vector<uint64_t> bounds = marks_.empty() ? std::vector<uint64_t>{0} : marks_;
    std::vector<TimelineSummary> out(bounds.size());
    std::vector<std::vector<TimelineInterval>> gpu(bounds.size()), host(bounds.size());
    for (const Rec& r : recs) {
        const auto up = std::upper_bound(bounds.begin(), bounds.end(), r.iv.start);
        if (up == bounds.begin()) continue;  // before the first mark
        const size_t w = size_t(up - bounds.begin()) - 1;
        if (r.kind == host_call) {
            host[w].push_back(r.iv);
            continue;
        }
        gpu[w].push_back(r.iv);
        (r.kind == gpu_kernel ? out[w].kernels
         : r.kind == gpu_copy ? out[w].copies
                              : out[w].memsets)++;
    }
    for (size_t w = 0; w < bounds.size(); w++) {
        out[w].dropped = int64_t(dropped);
        summarise_intervals(std::move(gpu[w]), host[w], names, gaps, top, out[w]);
    }
    return out;
}

}  // namespace zgpt
