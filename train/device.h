// Picks where to train from train.device (auto | cpu | cuda) and says why.
#pragma once
#include <memory>
#include <string>

namespace zgpt {

struct DeviceChoice {
    std::string device;                     // "cpu" | "cuda"
    std::string reason;                     // one line for the log
    std::string gpu_name, driver, runtime;  // provenance; empty when unknown
    int gpus = 0;                           // usable CUDA devices (0 in a build without CUDA)
};

// Physical memory of this machine in bytes (0 when unknown).
double host_memory_bytes();

// A line for rank 0 when the start-up's draw of the initial weights will run on one host thread
// while the machine has cores to spare (torchrun sets OMP_NUM_THREADS=1 for its ranks), else
// empty. `threads`: OpenMP's for this process; `cores`: the machine's; `ranks_here`: the
// processes of this run that share them. Models under 300M parameters draw in under about 10 s
// on one core and get no line.
std::string one_thread_draw_note(double parameters, int threads, int cores, int ranks_here);

// auto: the GPU when this build has CUDA and a device is usable, else the CPU with a line that
// says why. cuda: an error when no GPU can be used.
DeviceChoice choose_device(const std::string& requested);

// The GPU board's power and SM clock for a run's metrics (kernels/core/gpu_power.h, through NVML):
// means over the time since the previous read(). On the CPU, in a build without CUDA or where NVML
// is missing it samples nothing (samples == 0).
class PowerMeter {
  public:
    explicit PowerMeter(bool gpu);
    ~PowerMeter();
    struct Reading {
        int samples = 0;
        double power_w = 0, sm_clock_mhz = 0;
    };
    Reading read();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Dense peak FLOP/s of a GPU (by its name) for bf16 tensor-core or fp32 arithmetic, for MFU;
// 0 when the GPU is not in the table.
double peak_flops(const std::string& gpu_name, bool bf16);

}  // namespace zgpt
