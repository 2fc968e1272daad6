//===- CudaLocalCommunicator.h - Ranks as threads sharing one GPU ---------===//
//
// NCCL refuses two ranks of one communicator on one GPU, so a single-GPU run of a parallel
// plan (every rank a thread of parrun, as LocalWorld does on the CPU) talks through this
// instead. Buffers are device pointers on the shared device (see CudaCommunicator.h).
//
// The ranks meet through a LocalWorld: its collectives carry, instead of the data, each
// member's device pointers and the event that marks its data ready, so the rendezvous,
// deadlines, failure propagation and tag matching are LocalWorld's own. The member at
// position 0 of the group then folds every member's buffer in list order with one kernel on
// its own stream and writes the result into every member's output (all-reduce,
// reduce-scatter) or copies the parts device to device (all-gather); a second rendezvous
// tells the others that its completion event is recorded, and their compute streams wait
// for it. A send copies into a stream-ordered buffer that the receiver copies out of and frees.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_RUNTIME_CUDALOCALCOMMUNICATOR_H
#define PARC_RUNTIME_CUDALOCALCOMMUNICATOR_H

#include "parc/Runtime/CudaCommunicator.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace parc::runtime {

class CudaLocalWorld {
public:
  /// `world` ranks on CUDA device `device`.
  CudaLocalWorld(int64_t world, int device = 0, CommOptions options = {});
  ~CudaLocalWorld();

  int64_t world() const;
  int device() const { return device_; }
  CudaCommunicator &communicator(int64_t rank);

  /// Runs `body` on one thread per rank, each with the device selected, and returns one
  /// message per rank, empty when that rank finished (as LocalWorld::run).
  std::vector<std::string> run(const std::function<void(CudaCommunicator &)> &body);

  /// The first failure of any rank, empty while there is none.
  std::string failure() const;

private:
  int device_;
  LocalWorld host;
  std::vector<std::unique_ptr<CudaCommunicator>> communicators;
};

} // namespace parc::runtime

#endif // PARC_RUNTIME_CUDALOCALCOMMUNICATOR_H
