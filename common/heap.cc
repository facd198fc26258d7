#include "common/heap.h"

#include <cstdlib>  // defines __GLIBC__ where the C library is glibc

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace drafthead {

void KeepRequestBuffersInHeap() {
#ifdef __GLIBC__
  // 32 MB: glibc's largest mmap threshold (a larger block is mapped whatever is set). Setting it
  // also stops glibc's own adjustment of both thresholds.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace drafthead
