// What CUDA device (if any) this process can use. Plain C++ header: callable from CPU code; the
// definitions are in cuda_device.cu and exist only in CUDA builds (ZGPT_HAVE_CUDA).
#pragma once
#include <string>

namespace zgpt::cuda {

struct DeviceInfo {
    int count = 0;      // usable devices
    std::string error;  // why count is 0, when it is
    std::string name;   // device 0
    int sm_count = 0;
    int driver_version = 0, runtime_version = 0;
    double memory_gb = 0;
};

DeviceInfo query_devices();

// Whether the current device is compute capability 9.0 (H100 / H200: the sm_90a kernels run),
// asked once per process; false without a usable device.
bool current_device_is_sm90();
// The current device's multiprocessors, asked once per process (one GPU model per process);
// throws zgpt::Error on a CUDA error.
int current_device_sm_count();
// The SMs that the persistent kernels (a grid of at most one CTA per SM, and cuBLASLt's GEMMs)
// leave to NCCL's kernels while collectives run beside them (parallel.collective_sms, set around
// the overlapped parts of a step). A CTA that finds its SM taken would otherwise wait, and with
// it the whole kernel: a second wave of the tiles that CTA owns. Per thread, since local ranks
// are threads of one process.
void set_collective_sms(int n);
int collective_sms();
// The grid of a persistent kernel: current_device_sm_count() less collective_sms(), at least 1.
int compute_sm_count();
// collective_sms() = n for a scope, then what it was.
class CollectiveSmsScope {
  public:
    explicit CollectiveSmsScope(int n) : before_(collective_sms()) { set_collective_sms(n); }
    ~CollectiveSmsScope() { set_collective_sms(before_); }
    CollectiveSmsScope(const CollectiveSmsScope&) = delete;
    CollectiveSmsScope& operator=(const CollectiveSmsScope&) = delete;

  private:
    int before_;
};

}  // namespace zgpt::cuda
