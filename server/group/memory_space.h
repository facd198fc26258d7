// Where a buffer lives. Shared by the collectives (which may or may not accept device memory) and
// the compute backends (which hand out buffers in either), so it sits below both.
#pragma once

namespace drafthead {

enum class MemorySpace { kHost, kDevice };

}  // namespace drafthead
