// sim.h: what the stand-in NCCL (nccl.cpp) shares with the stand-in CUDA
// driver (sim.cpp): the simulated devices, their in-order work queues
// (the legacy default stream, which every blocking stream orders with),
// and the registry of device allocations.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace cpusim {

// Dev is one simulated device. Its queue holds the work that runs apart
// from the host thread (NCCL operations, which wait for peers); every
// other operation runs on the calling thread at once, after the queue has
// drained, so the device's work stays in the order it was posted.
struct Dev {
    int ordinal = 0;   // as the process sees it (after CUDA_VISIBLE_DEVICES)
    int physical = 0;  // the device of the machine
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<std::string()>> queue;  // each returns "" or why it failed
    bool busy = false;                                // the worker runs an item
    std::string error;  // a failed item's message: sticky, as CUDA's launch failures
    bool started = false;  // the worker thread runs
};

// device returns simulated device ordinal (null when out of range).
Dev* device(int ordinal);
// device_count is how many devices the process sees.
int device_count();
// current_device is the calling thread's current device (cuCtxSetCurrent,
// cudaSetDevice; 0 before either).
Dev* current_device();
// stream_device is the device of stream handle s (0: the current device's
// legacy default stream).
Dev* stream_device(void* s);
// enqueue posts work on d's queue; it runs after everything posted before.
void enqueue(Dev* d, std::function<std::string()> work);
// drain waits until d's queue is empty and returns its sticky error ("" if
// none).
std::string drain(Dev* d);
// allocation_fits says whether [p, p+n) lies inside one live device
// allocation.
bool allocation_fits(const void* p, size_t n);

}  // namespace cpusim
