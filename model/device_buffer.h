// RAII owners of device memory (DeviceBuffer) and page-locked host memory (PinnedBuffer), as
// GptCuda's arenas and staging buffers use them. Header-only; needs the CUDA runtime.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <utility>

#include "kernels/core/cuda_check.h"

namespace zgpt {

// One device allocation, freed with its owner.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    // Zeroed, and the zeros have landed on return: cudaMemset on device memory returns before it
    // runs, on the default stream, which the model's non-blocking streams do not wait for; a kernel
    // on one of them could write the buffer before the memset ran and see its data zeroed.
    explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
        if (!bytes || sizing_only()) return;
        ZG_CUDA_CHECK(cudaMalloc(&p_, bytes));
        ZG_CUDA_CHECK(cudaMemsetAsync(p_, 0, bytes, nullptr));
        ZG_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
    // Bytes [offset, offset + bytes) of `owner`, which keeps the memory (the view never frees
    // it): buffers that are never live at the same time can share one allocation.
    static DeviceBuffer view(const DeviceBuffer& owner, size_t offset, size_t bytes) {
        if (offset + bytes > owner.bytes_)
            throw std::logic_error("DeviceBuffer::view past the end of its owner");
        DeviceBuffer v;
        v.p_ = bytes && owner.p_ ? static_cast<char*>(owner.p_) + offset : nullptr;
        v.bytes_ = bytes;
        v.owned_ = false;
        return v;
    }
    ~DeviceBuffer() {
        if (p_ && owned_) cudaFree(p_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), owned_(o.owned_) {
        o.p_ = nullptr;
        o.bytes_ = 0;
    }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(bytes_, o.bytes_);
        std::swap(owned_, o.owned_);
        return *this;
    }
    void* get() const { return p_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(p_);
    }
    size_t bytes() const { return bytes_; }
    // While a SizingOnly lives, buffers made on this thread only record their size (no memory,
    // a null pointer): the model is built once that way to tell what it will allocate.
    struct SizingOnly {
        SizingOnly() { sizing_only() = true; }
        ~SizingOnly() { sizing_only() = false; }
        SizingOnly(const SizingOnly&) = delete;
        SizingOnly& operator=(const SizingOnly&) = delete;
    };
    static bool& sizing_only() {
        static thread_local bool on = false;
        return on;
    }
    size_t owned_bytes() const { return owned_ ? bytes_ : 0; }  // 0 for a view

  private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
    bool owned_ = true;
};

// Page-locked host memory: copies from it are truly asynchronous (a copy from pageable memory
// waits for the stream first). Each buffer is rewritten only after a sync that follows its copy.
template <typename T>
class PinnedBuffer {
  public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(size_t n) : n_(n) {
        if (n) ZG_CUDA_CHECK(cudaMallocHost(&p_, n * sizeof(T)));
    }
    ~PinnedBuffer() {
        if (p_) cudaFreeHost(p_);
    }
    PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
        o.p_ = nullptr;
        o.n_ = 0;
    }
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(n_, o.n_);
        return *this;
    }
    T* get() const { return p_; }

  private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

}  // namespace zgpt
