// Lays out sub-buffers of one caller-provided workspace, each 256-byte aligned. Constructed on a
// null base it only measures, so a variant's workspace size and its layout come from the same
// code and cannot drift apart.
#pragma once
#include <cstddef>

namespace zgpt {

class WorkspaceLayout {
  public:
    explicit WorkspaceLayout(void* base) : base_(static_cast<unsigned char*>(base)) {}
    template <typename T>
    T* take(size_t count) {
        T* r = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
        used_ += (count * sizeof(T) + 255) / 256 * 256;
        return r;
    }
    size_t bytes() const { return used_; }

  private:
    unsigned char* base_;
    size_t used_ = 0;
};

}  // namespace zgpt
