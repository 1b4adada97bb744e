#include "train/backends/zero1_weight_gather.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/core/cuda_check.h"
#include "kernels/ops/copy_spans.h"
#include "train/backends/device_copies.h"
#include "train/backends/zero1_span_plan.h"

namespace zgpt {

namespace {

// A span table on the device, ordered before copy_spans on `stream`.
DeviceBuffer upload(const std::vector<cuda::CopySpan>& spans, void* stream) {
    DeviceBuffer d(std::max<size_t>(1, spans.size()) * sizeof(cuda::CopySpan));
    to_device(d.get(), spans.data(), spans.size() * sizeof(cuda::CopySpan), stream);
    return d;
}

}  // namespace

Zero1WeightGather::Zero1WeightGather(GptCuda& model, Communicator& comm, int64_t chunk)
    : model_(model), comm_(comm), chunk_(chunk) {
    const int R = comm.size(), me = comm.rank();
    ZG_CHECK(R >= 2 && model.holds_equal_chunks(chunk, R),
             "Zero1WeightGather: the chunks do not fit the arena");
    if (!model.params_bf16_device()) return;
    const auto spans = model.master_read_spans();
    int64_t total = 0;
    for (const auto& [lo, hi] : spans) total += hi - lo;
    // the norms' weights are about 0.02% of GPT-2 1558M; an fp32 residual stream's embeddings
    // would make the packed gather a second arena
    if (total * 100 > model.num_parameters()) return;
    working_copy_ = true;
    const Zero1SpanPlan plan = plan_span_gather(spans, model.num_parameters(), R, me, chunk);
    block_ = plan.block;
    ZG_CHECK(plan.pack.size() <= 65535 && plan.unpack.size() <= 65535,
             "Zero1WeightGather: too many spans of fp32 weights");
    packs_ = int(plan.pack.size());
    unpacks_ = int(plan.unpack.size());
    pack_ = upload(plan.pack, model.stream());
    unpack_ = upload(plan.unpack, model.stream());
    staging_ = DeviceBuffer(size_t(std::max<int64_t>(1, block_ * R)) * 4);
}

void Zero1WeightGather::after_step() {
    const int me = comm_.rank();
    float* w = model_.params_device();
    if (!working_copy_) {
        comm_.all_gather(w + me * chunk_, w, chunk_, CommType::f32);
        model_.refresh_bf16_copy();  // (nothing in fp32 precision)
        return;
    }
    auto* w16 = static_cast<uint16_t*>(model_.params_bf16_device());
    comm_.all_gather(w16 + me * chunk_, w16, chunk_, CommType::b16);
    if (block_ > 0) {
        auto* st = staging_.as<float>();
        auto* s = static_cast<CUstream_st*>(model_.stream());
        cuda::copy_spans(st, w, pack_.as<cuda::CopySpan>(), packs_, s);
        comm_.all_gather(st + me * block_, st, block_, CommType::f32);
        cuda::copy_spans(w, st, unpack_.as<cuda::CopySpan>(), unpacks_, s);
    }
    stale_ = true;
}

void Zero1WeightGather::gather_masters() {
    if (!stale_) return;
    float* w = model_.params_device();
    comm_.all_gather(w + comm_.rank() * chunk_, w, chunk_, CommType::f32);
    ZG_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(model_.stream())));
    stale_ = false;
}

}  // namespace zgpt
