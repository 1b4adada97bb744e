// GptCuda's profiling: the loss head's event timing (head_ms()) and the per-op timing summary
// (take_op_times()).
#include <algorithm>

#include "model/gpt_cuda_impl.h"

namespace zgpt {

void GptCuda::set_profiling(bool on) {
    for (cudaEvent_t& e : impl_->ev)
        if (!e) ZG_CUDA_CHECK(cudaEventCreate(&e));
    impl_->profiling = on;
}

void GptCuda::set_op_profiling(bool on) {
    impl_->profile_ops = on;
    impl_->ticks.clear();
}

std::vector<std::pair<std::string, double>> GptCuda::take_op_times() {
    Impl& im = *impl_;
    ZG_CUDA_CHECK(cudaStreamSynchronize(im.stream));
    std::vector<std::pair<std::string, double>> r;
    for (size_t i = 1; i < im.ticks.size(); i++) {
        if (!im.ticks[i].first) continue;
        float ms = 0;
        ZG_CUDA_CHECK(cudaEventElapsedTime(&ms, im.ticks[i - 1].second, im.ticks[i].second));
        auto it = std::find_if(r.begin(), r.end(),
                               [&](const auto& x) { return x.first == im.ticks[i].first; });
        if (it == r.end())
            r.emplace_back(im.ticks[i].first, ms);
        else
            it->second += ms;
    }
    im.ticks.clear();
    return r;
}

double GptCuda::head_ms() const {
    ZG_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
    float a = 0, b = 0, c = 0;
    ZG_CUDA_CHECK(cudaEventElapsedTime(&a, impl_->ev[0], impl_->ev[1]));
    ZG_CUDA_CHECK(cudaEventElapsedTime(&b, impl_->ev[2], impl_->ev[3]));
    ZG_CUDA_CHECK(cudaEventElapsedTime(&c, impl_->ev[4], impl_->ev[5]));
    return double(a) + b + c;
}

}  // namespace zgpt
