// The one conversion of CUDA runtime, cuBLAS and NCCL results into absl::Status (CUDA builds only;
// link drafthead_cuda_status). Kernels return the raw library codes (kernels/cuda/cuda_check.h);
// the server's CUDA code turns them into Status here, so every caller sees one mapping:
//   CUDA: cudaErrorMemoryAllocation -> RESOURCE_EXHAUSTED, cudaErrorInvalidValue ->
//         INVALID_ARGUMENT, no / invalid device -> FAILED_PRECONDITION, anything else INTERNAL
//         (a sticky error may have left the device unusable);
//   cuBLAS: CUBLAS_STATUS_INVALID_VALUE -> INVALID_ARGUMENT, else INTERNAL;
//   NCCL: invalid argument / usage -> INVALID_ARGUMENT, else UNAVAILABLE (system, remote or
//         internal errors: the group is gone); ncclInProgress is OK (a non-blocking communicator
//         queued the call).
// Messages: "<library> error: <statement> (file:line, rank R): <name> (<description>)".
// One check macro per library, each returning the failure from the enclosing Status function:
//   DH_CUDA_RETURN_IF_ERROR(expr, rank), DH_CUBLAS_RETURN_IF_ERROR(expr, rank),
//   DH_NCCL_RETURN_IF_ERROR(expr, rank, comm) (comm: the ncclComm_t variable, read after the
//   call); the *_STATUS forms give the Status itself (OK on success) for a caller that must act
//   on a failure first, e.g. abort a communicator. rank -1: not known.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace drafthead {

inline absl::Status CudaCallStatus(cudaError_t e, const char* stmt, const char* file, int line,
                                   int rank) {
  if (e == cudaSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat("CUDA error: ", FailureSite(stmt, file, line, rank), ": ",
                                       cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorMemoryAllocation: return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue: return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice: return absl::FailedPreconditionError(msg);
    default: return absl::InternalError(msg);
  }
}

inline absl::Status CublasCallStatus(cublasStatus_t s, const char* stmt, const char* file,
                                     int line, int rank) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat("cuBLAS error: ", FailureSite(stmt, file, line, rank), ": ",
                                       cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
  return s == CUBLAS_STATUS_INVALID_VALUE ? absl::InvalidArgumentError(msg)
                                          : absl::InternalError(msg);
}

// comm (optional): adds the communicator's last error text; read here, after the call that may
// have created it.
inline absl::Status NcclCallStatus(ncclResult_t r, const char* stmt, const char* file, int line,
                                   int rank, const ncclComm_t* comm) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  std::string msg = absl::StrCat("NCCL error: ", FailureSite(stmt, file, line, rank), ": ",
                                 ncclGetErrorString(r));
  if (comm != nullptr && *comm != nullptr) {
    const char* last = ncclGetLastError(*comm);
    if (last && *last) absl::StrAppend(&msg, " (", last, ")");
  }
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return absl::InvalidArgumentError(msg);
    default: return absl::UnavailableError(msg);
  }
}

}  // namespace drafthead

#define DH_CUDA_STATUS(expr, rank) \
  ::drafthead::CudaCallStatus((expr), #expr, __FILE__, __LINE__, (rank))
#define DH_CUBLAS_STATUS(expr, rank) \
  ::drafthead::CublasCallStatus((expr), #expr, __FILE__, __LINE__, (rank))
#define DH_NCCL_STATUS(expr, rank, comm) \
  ::drafthead::NcclCallStatus((expr), #expr, __FILE__, __LINE__, (rank), &(comm))

#define DH_CUDA_RETURN_IF_ERROR(expr, rank) DH_RETURN_IF_ERROR(DH_CUDA_STATUS(expr, rank))
#define DH_CUBLAS_RETURN_IF_ERROR(expr, rank) DH_RETURN_IF_ERROR(DH_CUBLAS_STATUS(expr, rank))
#define DH_NCCL_RETURN_IF_ERROR(expr, rank, comm) DH_RETURN_IF_ERROR(DH_NCCL_STATUS(expr, rank, comm))
