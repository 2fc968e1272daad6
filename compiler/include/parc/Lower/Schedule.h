//===- Schedule.h - Per-stage pipeline schedules of one training step -----===//
//
// The instruction list each pipeline stage runs in one step: its forward and backward passes
// over (model chunk, microbatch) in the order of the chosen schedule, and the point-to-point
// transfers of activations and gradients between neighbouring stages.
//
// Model chunk c of stage s is virtual stage c * stages + s (Megatron's interleaving). Virtual
// stage 0 reads its input from the data loader and the last virtual stage computes the loss, so
// neither receives from outside at that end. When two consecutive virtual stages sit on the same
// stage (only with one stage and several chunks) the tensor stays local and no transfer exists.
//
// Transfer semantics the lowering must keep: a run of adjacent transfers between two computes
// is posted together (one NCCL group / batch_isend_irecv, as Megatron does), each send and
// receive completes when its peer has posted the matching one, and the next compute starts
// only when the whole run completed. See ScheduleVerifier.h for why one-at-a-time blocking
// transfers are not enough.
//
//===----------------------------------------------------------------------===//
#ifndef PARC_LOWER_SCHEDULE_H
#define PARC_LOWER_SCHEDULE_H

#include "parc/Sema/Program.h"
#include "parc/Support/Limits.h"

#include <cstdint>
#include <string>
#include <vector>

namespace parc {

struct PipelineConfig {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int64_t stages = 1;       // pp
  int64_t microbatches = 1; // M
  int64_t chunks = 1;       // v: model chunks per stage, more than 1 only when interleaved

  int64_t virtualStages() const { return stages * chunks; }
  int64_t virtualStageOf(int64_t stage, int64_t chunk) const { return chunk * stages + stage; }
  int64_t stageOfVirtual(int64_t virtualStage) const { return virtualStage % stages; }
  int64_t chunkOfVirtual(int64_t virtualStage) const { return virtualStage / stages; }
};

enum class PipeOpKind : uint8_t {
  Forward,
  Backward,
  RecvActivation,
  SendActivation,
  RecvGradient,
  SendGradient
};

/// One instruction of a stage. `chunk` is always this stage's model chunk: the one that
/// computes, that produced the sent tensor, or that consumes the received one. `peer` is the
/// other stage of a transfer and -1 for a compute. 16-bit fields keep a deep pipeline's
/// programs small: the report builds gpt3-175b's 36,096 instructions in every run, and their
/// first-touched pages cost more than the work. Limits.h bounds them: every virtual stage holds
/// a block, so stages x chunks <= MaxBlocks, and M <= MaxMicrobatches.
struct PipeOp {
  PipeOpKind kind = PipeOpKind::Forward;
  int16_t chunk = 0;
  int16_t microbatch = 0;
  int16_t peer = -1;

  bool isCompute() const { return kind == PipeOpKind::Forward || kind == PipeOpKind::Backward; }
  bool isSend() const {
    return kind == PipeOpKind::SendActivation || kind == PipeOpKind::SendGradient;
  }
  bool operator==(const PipeOp &other) const {
    return kind == other.kind && chunk == other.chunk && microbatch == other.microbatch &&
           peer == other.peer;
  }
};

static_assert(limits::MaxBlocks <= INT16_MAX && limits::MaxMicrobatches <= INT16_MAX,
              "a PipeOp's fields hold any chunk, stage and microbatch within the limits");

using StageProgram = std::vector<PipeOp>;

const char *toString(PipeOpKind kind);
/// "fwd c0 mb3", "send_act c0 mb3 to stage 1", "recv_grad c1 mb0 from stage 3".
std::string toString(const PipeOp &op);

/// Why `config` cannot be scheduled (a lower-case sentence with the fix), or empty when it can.
std::string pipelineConfigProblem(const PipelineConfig &config);

/// One program per stage, indexed by stage. `config` must have no pipelineConfigProblem.
///   gpipe: every forward, then every backward, both in microbatch order.
///   1f1b: Megatron's forward_backward_pipelining_without_interleaving.
///   interleaved: Megatron's forward_backward_pipelining_with_interleaving, including where it
///   posts its receives (one compute early, which its schedule needs to avoid a deadlock).
std::vector<StageProgram> buildPipelineSchedule(const PipelineConfig &config);

} // namespace parc

#endif
